"""Shared pieces of the qpa.ai/v1alpha1 models: the base model, cross-field rules, patterns,
references, object store, resources and conditions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from qpa.api.v1alpha1.rules import (
    ENDPOINT_HOST_RULES,
    ENDPOINT_QUERY_RULES,
    PLAIN_TEXT,
    URI_TEXT_RULES,
    endpoint_host_problem,
    endpoint_query_problem,
    text_problem,
    uri_text_problem,
)

GROUP: Final = "qpa.ai"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "qpa.ai/v1alpha1"  # GROUP/VERSION, spelled out for the Literal below
CATEGORY = "qpa"

# Longest metadata.name of every kind: children are named `<name>-<suffix>` (Jobs, Services,
# Leases) and a Service name is a DNS label of at most 63 characters.
MAX_NAME_LENGTH = 52

EnvironmentKind = Literal["sandbox", "llm_sim", "device", "mcp", "agentdojo", "bfcl"]
#: A suite's name: qpa's (`mobilepa`), or a public benchmark's (`agentdojo/<suite>[@<attack>]`,
#: `bfcl/<category>`); lower-case words, so a name is never a path or an option.
SUITE_NAME = r"^[a-z][a-z0-9_]*(/[a-z][a-z0-9_]*(@[a-z][a-z0-9_]*)?)?$"
Capability = Literal["tool_use", "memory", "skills", "subagent"]
Split = Literal["train", "validation", "test"]
Stage = Literal["sft", "rl"]
Planner = Literal["openai", "local", "oracle", "noisy", "noop", "greedy_wrong"]
ConditionStatus = Literal["True", "False", "Unknown"]
Offload = Literal["none", "cpu", "nvme"]

# Patterns shared by several fields (Go RE2 and Python re agree on all of them).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ARTIFACT_URI = r"^(s3|file)://\S+$"
MODEL_URI = r"^(s3|gs|pvc|hf|file)://\S+$"
HTTP_URL = r"^https?://\S+$"
# An S3 API endpoint: scheme and host name or IPv4 [:port] only (no credentials, path, query,
# IPv6 literal), which the pods' StoreConfig accepts.
S3_ENDPOINT = r"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$"
# A container image reference as registries read it: [host[:port]/]path[:tag][@sha256:digest],
# lower-case path components; never an option (`--privileged`) or a word with spaces.
IMAGE = (
    r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
# A DNS-1035 label: what a Service's name must be (children are named `<name>-<suffix>`).
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A version a pod reads from its environment and a path is made of (Harness versions): words of
# letters, digits, '-', '_', '.' and '+', never a '..' or a leading dot.
VERSION_TEXT = r"^[A-Za-z0-9]+([-_.+][A-Za-z0-9]+)*$"
VERSION_MESSAGE = "must be letters, digits, '-', '_', '.' and '+' (no '..', no path)"
# An adb serial (`R58M123ABC`, `emulator-5554`, `192.168.1.5:5555`): it is passed to adb as an
# argument, so no shell or option characters.
ADB_SERIAL = r"^[A-Za-z0-9][-A-Za-z0-9._:]*$"
# ConfigMap and Secret keys as Kubernetes checks them (IsConfigMapKey): [-._a-zA-Z0-9]+, but
# not "." or ".." and never starting with "..": a key is also a file name in a mounted volume.
CONFIG_KEY = r"^\.?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


# --------------------------------------------------------------------------- bounds

#: Longest URI or URL any field takes.
MAX_URI_LENGTH: Final = 2048
#: Longest free text (condition messages, reasons of a decision).
MAX_MESSAGE_LENGTH: Final = 32768
#: Most entries of a map of user-set strings (labels of nodes, resources, metrics).
MAX_MAP_ENTRIES: Final = 64

ShortText = Annotated[str, Field(max_length=63)]
"""A label-sized string (versions, suites, ids)."""
Text = Annotated[str, Field(max_length=253)]
"""A name-sized string (model names, serials, node names)."""
Message = Annotated[str, Field(max_length=MAX_MESSAGE_LENGTH)]
"""Free text written by the operator or a pod."""
UriText = Annotated[str, Field(max_length=MAX_URI_LENGTH)]
"""A URI the operator or a pod reports (status): bounded, never user-set."""
#: Longest container image reference (registry/path:tag@sha256:digest).
MAX_IMAGE_LENGTH: Final = 1024
#: Largest seed (a 32-bit generator seed).
MAX_SEED: Final = 2**31 - 1
#: metadata.generation is an int64.
MAX_GENERATION: Final = 2**63 - 1
Count = Annotated[int, Field(ge=0, le=1_000_000_000)]
"""A count the operator reports (tasks, pods, phones, sessions)."""


# --------------------------------------------------------------------------- URIs

# Credentials never travel inside a URI: a URI is copied into Job arguments, status, logs and
# `kubectl get -o wide`, where anyone who may read the resource reads them. Endpoint and keys
# come from Secrets (`store.secretRef`, `apiKeySecretRef`). Two shapes give credentials away:
# userinfo (`s3://KEY:SECRET@bucket/...`) and a signed or tokened query string (presigned S3/GCS
# URLs, Azure SAS, `?token=`). Both are refused in every URI and URL, by pydantic and, with the
# same messages, by the API server (CEL rules next to the pattern of each field).
USERINFO = r"^[A-Za-z][-A-Za-z0-9+.]*://[^/?#]*@"
CREDENTIAL_QUERY = (
    r"(?i)[?&;](x-amz-[a-z0-9-]*|x-goog-[a-z0-9-]*|sig|signature|sv|se|skoid|"
    r"[a-z0-9_.-]*(token|secret|password|passwd|credential|api_?key|access_?key|auth)[a-z0-9_.-]*)="
)
USERINFO_MESSAGE = (
    "credentials are not allowed in a URI (user:password@); reference a Secret instead "
    "(store.secretRef, apiKeySecretRef)"
)
CREDENTIAL_QUERY_MESSAGE = (
    "a signed or credential-bearing query string (X-Amz-Credential, X-Amz-Signature, sig, "
    "token, secret, access_key, ...) is not allowed in a URI; reference a Secret instead"
)
# A store location: scheme, a bucket, claim or Hub organisation, then a path; no userinfo, port,
# query or fragment (none of them means anything to an object store, a claim or the Hub).
_LOCATION = r"://[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?(/[^\s?#]*)?$"
_HOST = r"[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?"


@dataclass(frozen=True)
class UriKind:
    """Which schemes a URI field takes, and why: one per use (written, read by pods, served)."""

    schemes: tuple[str, ...]
    use: str

    @property
    def pattern(self) -> str:
        if self.schemes == ("http", "https"):
            return rf"^https?://{_HOST}([/?#]\S*)?$"
        remote = [scheme for scheme in self.schemes if scheme != "file"]
        if "file" in self.schemes:  # file:///abs/path: no host, an absolute path
            return rf"^(({'|'.join(remote)}){_LOCATION[:-1]}|file:///[^\s?#]*)$"
        return rf"^({'|'.join(remote)}){_LOCATION}"

    @property
    def scheme_message(self) -> str:
        names = [f"{scheme}://" for scheme in self.schemes]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        if self.schemes == ("http", "https"):
            return "must be an http:// or https:// URL"
        if "file" in self.schemes:
            return f"must be an {listed} URI ({self.use})"
        return (
            f"must be an {listed} URI ({self.use}; file:// and local paths do not exist on a "
            "cluster)"
        )

    @property
    def shape_message(self) -> str:
        if self.schemes == ("http", "https"):
            return "must be a URL with a host name or IPv4 address and an optional port"
        return (
            "must be scheme://<bucket, claim or organisation>/<path> (no port, query string or "
            "fragment)"
        )

    @property
    def endpoint(self) -> bool:
        """Whether the URI is an HTTP endpoint a pod connects to (egress and query rules)."""
        return self.schemes == ("http", "https")

    def rules(self) -> list[dict[str, str]]:
        schemes = "|".join(self.schemes)
        return [
            {"rule": f"!self.matches('{USERINFO}')", "message": USERINFO_MESSAGE},
            {"rule": f"!self.matches('{CREDENTIAL_QUERY}')", "message": CREDENTIAL_QUERY_MESSAGE},
            *URI_TEXT_RULES,
            {"rule": f"self.matches('^({schemes})://')", "message": self.scheme_message},
            *((*ENDPOINT_HOST_RULES, *ENDPOINT_QUERY_RULES) if self.endpoint else ()),
        ]

    def check(self, value: Any) -> Any:
        """Refuse `value` with the message the server gives (before pydantic's pattern check,
        whose message says less); a non-string is left to pydantic's type check. The text is
        checked in its normal form first, so no later check reads other than what is fetched."""
        if not isinstance(value, str):
            return value
        if re.search(USERINFO, value):
            raise ValueError(USERINFO_MESSAGE)
        if re.search(CREDENTIAL_QUERY, value):
            raise ValueError(CREDENTIAL_QUERY_MESSAGE)
        problem = uri_text_problem(value)
        if problem:
            raise ValueError(problem)
        if not re.match(rf"^({'|'.join(self.schemes)})://", value):
            raise ValueError(self.scheme_message)
        if self.endpoint:
            problem = endpoint_host_problem(value) or endpoint_query_problem(value)
            if problem:
                raise ValueError(problem)
        if not re.search(self.pattern, value):
            raise ValueError(self.shape_message)
        return value

    def type(self) -> Any:
        """The annotated `str` of a field of this kind (pydantic checks, CRD pattern and CEL)."""
        schema = {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_URI_LENGTH,
            "pattern": self.pattern,
            "x-kubernetes-validations": self.rules(),
        }
        return Annotated[
            str,
            Field(min_length=1, max_length=MAX_URI_LENGTH, pattern=self.pattern),
            BeforeValidator(self.check),
            WithJsonSchema(schema),
        ]


#: Where a pod writes or the operator reads results: the object store only.
OUTPUT_URI = UriKind(("s3",), "results are written to and read from the object store")
#: Data a pod reads (tasks, datasets, checkpoints to resume from): the object store.
DATA_URI = UriKind(("s3",), "pods read data from the object store")
#: A checkpoint a pod loads (`qpa.store.resolve_local`): the store, a mounted claim or the Hub.
CHECKPOINT_URI = UriKind(("s3", "pvc", "hf"), "pods load checkpoints with qpa.store")
#: A model KServe serves (`storageUri`): what its storage initializer downloads.
SERVING_URI = UriKind(("s3", "gs", "pvc", "hf"), "KServe's storage initializer downloads it")
#: Tasks or a dataset a process on this machine reads (local runs: `qpa collect --tasks`, the RL
#: config): the store or a local file. A custom resource's own fields use `DATA_URI`.
LOCAL_DATA_URI = UriKind(("s3", "file"), "the store or a file of this machine")
#: An HTTP endpoint pods call (an OpenAI-compatible model).
ENDPOINT_URL = UriKind(("http", "https"), "an HTTP endpoint")


def _no_credentials(value: Any) -> Any:
    if isinstance(value, str):
        if re.search(USERINFO, value):
            raise ValueError(USERINFO_MESSAGE)
        if re.search(CREDENTIAL_QUERY, value):
            raise ValueError(CREDENTIAL_QUERY_MESSAGE)
    return value


ResolvedUri = Annotated[
    str, Field(min_length=1, max_length=MAX_URI_LENGTH), BeforeValidator(_no_credentials)
]
"""A URI the operator resolved for a pod (any scheme the pod's reader then judges), never one
with credentials in it."""

OutputUri = OUTPUT_URI.type()
DataUri = DATA_URI.type()
CheckpointUri = CHECKPOINT_URI.type()
ServingUri = SERVING_URI.type()
EndpointUrl = ENDPOINT_URL.type()
LocalDataUri = LOCAL_DATA_URI.type()


# --------------------------------------------------------------------------- quantities

_QUANTITY_SCALE: Final = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{
        suffix: Decimal(1024**power)
        for power, suffix in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"], 1)
    },
}
_QUANTITY_PARTS = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")


def parse_quantity(value: int | str) -> Decimal:
    """The value of a Kubernetes quantity (`500m` -> 0.5, `1Gi` -> 1073741824)."""
    text = str(value)
    parts = _QUANTITY_PARTS.match(text)
    if not re.match(QUANTITY, text) or parts is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 1Gi, 2)")
    number, suffix = parts.groups()
    try:
        if suffix in _QUANTITY_SCALE:
            return Decimal(number) * _QUANTITY_SCALE[suffix]
        return Decimal(number) * Decimal(10) ** Decimal(suffix[1:])
    except (InvalidOperation, ArithmeticError):
        raise ValueError(f"{text!r} is out of range for a quantity") from None


#: Most of each resource one pod may ask for: beyond these no node exists.
RESOURCE_CAPS: Final = {
    "cpu": "1024",
    "memory": "16Ti",
    "ephemeral-storage": "64Ti",
    "nvidia.com/gpu": "64",
    "amd.com/gpu": "64",
}
#: Most of any other resource (hugepages, devices): a bound, so nothing overflows.
RESOURCE_CAP_OTHER: Final = "1Pi"
#: Resources counted in whole devices.
WHOLE_RESOURCES: Final = ("nvidia.com/gpu", "amd.com/gpu")
MAX_RESOURCES: Final = 16
POSITIVE_QUANTITY_MESSAGE = "must be a positive Kubernetes quantity below 8Ei (e.g. 500m, 1Gi, 2)"


#: The largest quantity Kubernetes represents (an int64 count of units: 8Ei less one).
MAX_QUANTITY: Final = "8Ei"


def _positive_quantity(value: int | str) -> int | str:
    number = parse_quantity(value)
    if number <= 0 or number >= parse_quantity(MAX_QUANTITY):
        raise ValueError(POSITIVE_QUANTITY_MESSAGE)
    return value


def _q(expr: str) -> str:
    return f"quantity(string({expr}))"


def _valid_q(expr: str) -> str:
    return f"isQuantity(string({expr}))"


def _resource_list_rules(field: str) -> list[dict[str, str]]:
    """CEL of one resource map: names, caps, whole devices (each guarded by isQuantity, so a
    malformed value reports its own error, not a CEL one)."""
    rules = [
        {
            # names at most as long as a qualified name; their syntax is the API server's check
            # on the pod (a regex over map keys, whose length the schema cannot bound, exceeds
            # the CEL cost budget)
            "rule": "self.all(k, size(k) <= 253)",
            "message": f"{field}: resource names must be at most 253 characters",
        }
    ]
    for name, cap in RESOURCE_CAPS.items():
        rules.append(
            {
                "rule": f"!('{name}' in self) || !{_valid_q(f'self[{name!r}]')} || "
                f"{_q(f'self[{name!r}]')}.compareTo(quantity('{cap}')) <= 0",
                "message": f"{field}.{name} must be at most {cap}",
            }
        )
    rules.append(
        {
            "rule": f"self.all(k, !{_valid_q('self[k]')} || "
            f"{_q('self[k]')}.compareTo(quantity('{RESOURCE_CAP_OTHER}')) <= 0)",
            "message": f"every quantity of {field} must be at most {RESOURCE_CAP_OTHER}",
        }
    )
    for name in WHOLE_RESOURCES:
        rules.append(
            {
                "rule": f"!('{name}' in self) || !{_valid_q(f'self[{name!r}]')} || "
                f"{_q(f'self[{name!r}]')}.isInteger()",
                "message": f"{field}.{name} must be a whole number",
            }
        )
    return rules


def _check_resource_list(field: str, values: dict[str, int | str]) -> dict[str, int | str]:
    """The Python side of `_resource_list_rules` (same messages)."""
    for key in values:
        if len(key) > 253:
            raise ValueError(f"{field}: resource names must be at most 253 characters")
    amounts = {key: parse_quantity(value) for key, value in values.items()}
    for name, cap in RESOURCE_CAPS.items():
        if name in amounts and amounts[name] > parse_quantity(cap):
            raise ValueError(f"{field}.{name} must be at most {cap}")
    if any(amount > parse_quantity(RESOURCE_CAP_OTHER) for amount in amounts.values()):
        raise ValueError(f"every quantity of {field} must be at most {RESOURCE_CAP_OTHER}")
    for name in WHOLE_RESOURCES:
        if name in amounts and amounts[name] != amounts[name].to_integral_value():
            raise ValueError(f"{field}.{name} must be a whole number")
    return values


def _resource_list(field: str, description: str) -> Any:
    extra: dict[str, Any] = {"x-kubernetes-validations": _resource_list_rules(field)}
    return Field(
        default_factory=dict,
        max_length=MAX_RESOURCES,
        description=description,
        json_schema_extra=extra,
    )


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class CrossFieldRule:
    """A validation rule spanning several fields of one object: CEL for the server, Python here.

    `cel` is evaluated with `self` bound to the object the rule is attached to; `check` gets the
    parsed model and returns True when the object is valid. `cel=None` marks a rule the server
    enforces otherwise (a list-type) or cannot express (CEL has no index loops): Python only.
    """

    cel: str | None
    message: str
    check: Callable[[Any], bool]

    def to_k8s(self) -> dict[str, str]:
        if self.cel is None:
            raise ValueError(f"rule {self.message!r} has no CEL form")
        return {"rule": self.cel, "message": self.message}


def _immutable(message: str) -> dict[str, Any]:
    """`json_schema_extra` of a field the server must keep as created (a CEL transition rule)."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


def _add_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[CrossFieldRule, ...] = getattr(cls, "RULES", ())
    cel_rules = [rule.to_k8s() for rule in rules if rule.cel is not None]
    if cel_rules:
        schema["x-kubernetes-validations"] = cel_rules


def _s3_needs_store(field: str = "outputUri") -> CrossFieldRule:
    return CrossFieldRule(
        cel=f"!self.{field}.startsWith('s3://') || has(self.store)",
        message=f"an s3:// {field} needs store (endpoint and secretRef)",
        check=lambda m: not getattr(m, _snake(field)).startswith("s3://") or m.store is not None,
    )


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def _plain_text(value: Any) -> Any:
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise ValueError(problem)
    return value


def _plain_text_field(info: FieldInfo) -> bool:
    """Whether a field is a string with no pattern of its own, short of free text (a message
    up to `MAX_MESSAGE_LENGTH` may hold line breaks): it gets the `PLAIN_TEXT` pattern, since
    such strings reach environment variables, labels, events and paths."""
    if info.annotation not in (str, str | None):
        return False
    if isinstance(info.json_schema_extra, dict) and {"pattern", "enum"} & set(
        info.json_schema_extra
    ):
        return False
    for meta in info.metadata:
        if getattr(meta, "pattern", None) is not None:
            return False
        if getattr(meta, "max_length", 0) >= MAX_MESSAGE_LENGTH:
            return False
    return True


class _Model(BaseModel):
    """Base of every spec and status model: camelCase on the wire, unknown fields are errors."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra=_add_rules,
    )

    RULES: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Integers are integers: `4.0`, `"4"` and `true` are refused where an integer is
        meant, as the API server's schema refuses them (pydantic would otherwise coerce)."""
        super().__pydantic_init_subclass__(**kwargs)
        changed = False
        for info in cls.model_fields.values():
            if info.annotation in (int, int | None) and not any(
                isinstance(m, Strict) for m in info.metadata
            ):
                info.metadata.append(Strict())
                changed = True
            elif _plain_text_field(info):
                info.metadata.append(AfterValidator(_plain_text))
                extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
                info.json_schema_extra = {**extra, "pattern": PLAIN_TEXT}
                changed = True
        if changed:
            cls.model_rebuild(force=True)

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        for rule in type(self).RULES:
            if not rule.check(self):
                raise ValueError(rule.message)
        return self

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase keys, JSON types, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _defaulted(model: type[_Model], description: str) -> Any:
    """A sub-object whose fields all have defaults: the server fills it in (`default: {}`)."""
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


def _list_set(description: str, **kwargs: Any) -> Any:
    """A list of unique strings (`x-kubernetes-list-type: set`, which the server enforces)."""
    return Field(
        default_factory=list,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "set"},
        **kwargs,
    )


def _check_unique(*fields: str) -> Callable[[Any], bool]:
    def check(model: Any) -> bool:
        return all(len(set(getattr(model, name))) == len(getattr(model, name)) for name in fields)

    return check


Name = Annotated[
    str,
    Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN),
]
# A Kubernetes quantity (`500m`, `1Gi`, `2`): an int-or-string on the wire, positive here.
Quantity = Annotated[
    int | Annotated[str, Field(pattern=QUANTITY, max_length=64)],
    AfterValidator(_positive_quantity),
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"{_valid_q('self')} && {_q('self')}.sign() == 1 && "
                    f"{_q('self')}.isLessThan(quantity('{MAX_QUANTITY}'))",
                    "message": POSITIVE_QUANTITY_MESSAGE,
                }
            ]
        }
    ),
]


# --------------------------------------------------------------------------- references


class LocalObjectReference(_Model):
    """A reference to another object in the same namespace, by name."""

    name: Name = Field(description="Name of the referenced object (same namespace).")


LabelName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
"""A name that is also a Service's or a label's (a DNS-1035 label: no dots)."""


class ServiceObjectReference(_Model):
    """A reference to a qpa object of the same namespace whose Service pods call (a pool)."""

    name: LabelName = Field(description="Name of the referenced object (a DNS-1035 label).")


Version = Annotated[str, Field(min_length=1, max_length=63, pattern=VERSION_TEXT)]
"""A version a pod reads from its environment and names a path with (no `..`, no path)."""


class SecretKeySelector(_Model):
    """One key of a Secret in the same namespace."""

    name: Name = Field(description="Name of the Secret.")
    key: str = Field(
        min_length=1, max_length=253, pattern=CONFIG_KEY, description="Key within the Secret."
    )


class ConfigMapKeySelector(_Model):
    """One key of a ConfigMap in the same namespace."""

    name: Name = Field(description="Name of the ConfigMap.")
    key: str = Field(
        default="harness.yaml",
        min_length=1,
        max_length=253,
        pattern=CONFIG_KEY,
        description="Key within the ConfigMap.",
    )


class StoreSecretRef(_Model):
    """A Secret holding S3 credentials under two keys."""

    name: Name = Field(description="Name of the Secret with the S3 credentials.")
    access_key_id_key: str = Field(
        default="accessKeyId",
        max_length=253,
        pattern=CONFIG_KEY,
        description="Key of the access key id within the Secret.",
    )
    secret_access_key_key: str = Field(
        default="secretAccessKey",
        max_length=253,
        pattern=CONFIG_KEY,
        description="Key of the secret access key within the Secret.",
    )


def _store_endpoint(value: Any) -> Any:
    """An object store's endpoint: no credentials, and no host no workload may reach."""
    if isinstance(value, str):
        if re.search(USERINFO, value):
            raise ValueError(USERINFO_MESSAGE)
        problem = endpoint_host_problem(value)
        if problem:
            raise ValueError(problem)
    return value


class ObjectStore(_Model):
    """S3-compatible object storage (MinIO, S3, SeaweedFS) that a resource reads or writes."""

    endpoint: Annotated[
        str,
        Field(pattern=S3_ENDPOINT, max_length=2048),
        BeforeValidator(_store_endpoint),
        WithJsonSchema(
            {
                "type": "string",
                "maxLength": 2048,
                "pattern": S3_ENDPOINT,
                "x-kubernetes-validations": [
                    {"rule": f"!self.matches('{USERINFO}')", "message": USERINFO_MESSAGE},
                    *ENDPOINT_HOST_RULES,
                ],
            }
        ),
    ] = Field(
        description="S3 API endpoint (scheme and host:port), e.g. http://minio.qpa-system:9000.",
    )
    region: str = Field(default="us-east-1", min_length=1, max_length=63, description="S3 region.")
    secret_ref: StoreSecretRef = Field(
        description="Secret with the credentials (never inlined in the resource)."
    )


class ResourceRequirements(_Model):
    """CPU, memory and accelerator requests and limits of each pod (Kubernetes quantities).

    Every quantity is positive and below what any node has (`RESOURCE_CAPS`: 1024 CPUs, 16Ti
    memory, 64 GPUs), GPUs are whole, and a limit is never below the request of the same
    resource.
    """

    requests: dict[str, Quantity] = _resource_list(
        "requests", "Minimum resources, e.g. {cpu: 500m, memory: 1Gi}."
    )
    limits: dict[str, Quantity] = _resource_list(
        "limits", "Maximum resources, e.g. {nvidia.com/gpu: 1}."
    )

    RULES = (
        CrossFieldRule(
            cel="!has(self.requests) || !has(self.limits) || self.requests.all(k, "
            "!(k in self.limits) || !"
            + _valid_q("self.requests[k]")
            + " || !"
            + _valid_q("self.limits[k]")
            + " || "
            + _q("self.limits[k]")
            + ".compareTo("
            + _q("self.requests[k]")
            + ") >= 0)",
            message="limits must not be below requests (a resource set in both)",
            check=lambda m: all(
                parse_quantity(m.limits[k]) >= parse_quantity(v)
                for k, v in m.requests.items()
                if k in m.limits
            ),
        ),
    )

    @field_validator("requests", "limits")
    @classmethod
    def _check_resources(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return _check_resource_list(to_camel(info.field_name or ""), value)


# --------------------------------------------------------------------------- common status


class Condition(_Model):
    """One aspect of the resource's state, in the shape of Kubernetes `metav1.Condition`."""

    type: str = Field(
        max_length=316, pattern=CONDITION_TYPE, description="Condition type, e.g. Ready."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON,
        description="Machine-readable CamelCase reason of the last transition.",
    )
    message: str = Field(
        default="", max_length=32768, description="Human-readable details of the transition."
    )
    last_transition_time: datetime = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="The .metadata.generation the condition was set for.",
    )


def set_condition(
    conditions: Iterable[Condition],
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return `conditions` with `type` set; lastTransitionTime moves only when status changes."""
    moment = (now or datetime.now(UTC)).replace(microsecond=0)
    result: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.type != type:
            result.append(condition)
            continue
        found = True
        changed = condition.status != status
        result.append(
            Condition(
                type=type,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=moment if changed else condition.last_transition_time,
                observed_generation=observed_generation,
            )
        )
    if not found:
        result.append(
            Condition(
                type=type,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=moment,
                observed_generation=observed_generation,
            )
        )
    return result


def _conditions() -> Any:
    return Field(
        default_factory=list,
        max_length=32,
        description="Kubernetes-style conditions (Ready, Progressing, Failed, ...), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def _observed_generation() -> Any:
    return Field(
        default=None,
        ge=0,
        le=MAX_GENERATION,
        description="The .metadata.generation this status was computed for.",
    )


def _timestamp(description: str) -> Any:
    return Field(default=None, description=description)
