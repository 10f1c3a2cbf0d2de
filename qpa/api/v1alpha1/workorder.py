"""The typed work order a pod runs, and the typed summary it reports back.

A custom resource is a work order: the operator writes the resource itself (apiVersion, kind,
metadata, spec) plus what it resolved for this pod (`resolved`: the object store, the
RolloutPool's URL, the attempt, the prepared dataset) into one YAML file, mounted into the pod,
and the container runs `qpa <stage> --spec FILE`. The stage turns it into its own config object
with one function per kind (`CollectConfig.from_taskbatch`, `...from_trainingrun`, ...), so no
field is translated twice and none is dropped.

The pod answers with a `PodSummary` subclass (one per stage, defined beside its kind) written as
compact JSON to its termination message (`$QPA_STATUS_FILE`); the operator parses it back with
the same model, one spelling per field.

    order = WorkOrder.load(path, TaskBatch)        # in the pod
    document = work_order_document(tb, resolved)   # in the operator (a ConfigMap's data)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Final, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from qpa.api.v1alpha1.base import ConfigMapKeySelector, ObjectStore, ResolvedUri, _Model
from qpa.api.v1alpha1.resource import CustomResource

#: Where the operator mounts the work order in every pod it creates, and the file's key.
WORK_ORDER_DIR: Final = "/etc/qpa/order"
WORK_ORDER_KEY: Final = "workorder.yaml"
WORK_ORDER_PATH: Final = f"{WORK_ORDER_DIR}/{WORK_ORDER_KEY}"
#: Where a spec's Harness ConfigMap key (`harness.configMapRef`) is mounted in a pod.
HARNESS_CONFIG_DIR: Final = "/etc/qpa/harness"
#: The variable the operator fills from a spec's `apiKeySecretRef` (never the key itself).
API_KEY_ENV: Final = "QPA_API_KEY"
#: Kubernetes keeps at most 4 KiB of a termination message.
SUMMARY_LIMIT: Final = 4096

R = TypeVar("R", bound=CustomResource)


class WorkOrderError(ValueError):
    """A work order that cannot be read or does not validate; the message names the field."""


class Resolved(_Model):
    """What the operator resolved for this pod beyond the spec (never user-set)."""

    namespace: str = Field(default="default", min_length=1, description="The resource's namespace.")
    store: ObjectStore | None = Field(
        default=None, description="The object store the pod reads and writes (spec or chart)."
    )
    rollout_pool_url: ResolvedUri | None = Field(
        default=None, description="Base URL of the referenced RolloutPool's Service."
    )
    device_bridge: str | None = Field(
        default=None, description="HOST:PORT of the referenced DevicePool's adb bridge."
    )
    rollout_server_url: ResolvedUri | None = Field(
        default=None, description="Base URL of the run's rollout server (TrainingRun)."
    )
    rollout_group_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of the rollout server's weight-sync rendezvous (TrainingRun).",
    )
    attempt: int = Field(default=0, ge=0, description="Attempt of the run (TrainingRun).")
    dataset_uri: ResolvedUri | None = Field(
        default=None, description="The dataset the data plan resolved (TrainingRun)."
    )
    model_url: ResolvedUri | None = Field(
        default=None, description="Endpoint of the served candidate model (HarnessRelease)."
    )
    harness_url: ResolvedUri | None = Field(
        default=None, description="Endpoint of the served candidate Harness (HarnessRelease)."
    )
    report_uri: ResolvedUri | None = Field(
        default=None, description="Where the benchmark publishes its report (HarnessRelease)."
    )


class WorkOrder(BaseModel, Generic[R]):
    """A custom resource plus what the operator resolved: the whole input of a pod."""

    model_config = ConfigDict(frozen=True)

    resource: R
    resolved: Resolved

    @classmethod
    def parse(cls, document: Any, kind: type[R], *, source: str = "work order") -> WorkOrder[R]:
        """Validate a parsed document (a dict) as a work order of `kind`."""
        if not isinstance(document, dict):
            raise WorkOrderError(f"{source}: expected a mapping, got {type(document).__name__}")
        body = dict(document)
        resolved_raw = body.pop("resolved", None) or {}
        if body.get("kind") != kind.info.kind:
            raise WorkOrderError(
                f"{source}: kind must be {kind.info.kind}, not {body.get('kind')!r}"
            )
        try:
            resource = kind.model_validate(body)
            resolved = Resolved.model_validate(resolved_raw)
        except ValidationError as exc:
            raise WorkOrderError(f"{source}: {first_error(exc)}") from None
        return cls(resource=resource, resolved=resolved)

    @classmethod
    def load(cls, path: str | Path, kind: type[R]) -> WorkOrder[R]:
        """Read the work order file a pod was given (`--spec FILE`)."""
        import yaml  # imported here: qpa.api imports only pydantic at module level

        try:
            document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise WorkOrderError(f"cannot read work order {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise WorkOrderError(f"{path}: not YAML: {exc}") from None
        return cls.parse(document, kind, source=str(path))

    @property
    def name(self) -> str:
        return self.resource.metadata.name or self.resource.info.singular


def harness_config_path(ref: ConfigMapKeySelector | None) -> str | None:
    """Where the pod finds the Harness YAML of `ref` (the operator mounts it there)."""
    return f"{HARNESS_CONFIG_DIR}/{ref.key}" if ref is not None else None


def work_order_document(resource: CustomResource, resolved: Resolved) -> dict[str, Any]:
    """The work order as the operator writes it: the resource's wire form plus `resolved`.

    Status is left out (the pod acts on the spec, never on what was observed).
    """
    body = resource.to_k8s()
    body.pop("status", None)
    meta = body.get("metadata") or {}
    body["metadata"] = {
        key: meta[key] for key in ("name", "namespace", "uid", "generation") if key in meta
    }
    body["resolved"] = resolved.to_k8s()
    return body


def dump_work_order(resource: CustomResource, resolved: Resolved) -> str:
    import yaml

    return yaml.safe_dump(work_order_document(resource, resolved), sort_keys=True)


def first_error(exc: ValidationError) -> str:
    """`field.path: message` of a validation error's first problem, on one line (a rule of the
    whole model names its field in its own message)."""
    error = exc.errors(include_url=False)[0]
    message = str(error["msg"]).removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        shown = repr(value)
        if len(shown) <= 80 and shown not in message:
            message += f", not {shown}"
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {message}" if where else message


# --------------------------------------------------------------------------- summaries


class PodSummary(_Model):
    """Base of the typed summary a pod leaves in its termination message.

    Subclasses set `STAGE` and their fields; `to_message()` writes the compact JSON the
    operator reads with `from_message()` (None when the message holds no valid summary).
    List fields shed their oldest items until the message fits Kubernetes' 4 KiB.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    STAGE: ClassVar[str] = ""

    def to_message(self, limit: int = SUMMARY_LIMIT) -> str:
        data = self.to_k8s()

        def encoded() -> str:
            return json.dumps(data, separators=(",", ":"))

        while len(encoded().encode()) > limit:
            lists = [key for key, value in data.items() if isinstance(value, list) and value]
            if not lists:
                raise ValueError(f"{type(self).__name__} does not fit in {limit} bytes")
            longest = max(lists, key=lambda key: len(json.dumps(data[key])))
            data[longest] = data[longest][1:]
        return encoded()

    @classmethod
    def from_message(cls, message: str | None) -> Self | None:
        """The summary in a termination message (text before the JSON is ignored), or None."""
        if not message:
            return None
        text = message.strip()
        start = text.find("{")
        if start < 0:
            return None
        try:
            return cls.model_validate_json(text[start:])
        except ValidationError:
            return None
