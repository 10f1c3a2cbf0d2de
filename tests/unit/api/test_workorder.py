"""Work orders (the pod's typed input) and pod summaries (its typed output)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from typer.testing import CliRunner

from qpa.api.v1alpha1 import (
    DevicePool,
    PodSummary,
    Resolved,
    RolloutPool,
    WorkOrder,
    WorkOrderError,
    dump_work_order,
    work_order_document,
)
from qpa.cli import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def example(name: str, index: int = 0) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return docs[index]


def test_a_work_order_round_trips_the_resource_and_what_was_resolved() -> None:
    pool = RolloutPool.model_validate(example("rolloutpool.yaml"))
    pool.metadata.namespace, pool.metadata.uid = "team-a", "u-1"
    resolved = Resolved(namespace="team-a", device_bridge="b.team-a.svc:5037", attempt=2)
    document = work_order_document(pool, resolved)
    assert "status" not in document and set(document["metadata"]) == {"name", "namespace", "uid"}
    order = WorkOrder.parse(yaml.safe_load(dump_work_order(pool, resolved)), RolloutPool)
    assert order.resource.spec == pool.spec and order.resolved == resolved
    assert order.name == pool.metadata.name


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(kind="DevicePool"), "kind must be RolloutPool"),
        (lambda d: d["spec"].update(sessionsPerPod=0), "spec.sessionsPerPod"),
        (lambda d: d["spec"].update(port="http"), "spec.port"),
        (lambda d: d["spec"].update(surprise=1), "spec.surprise"),
        (lambda d: d.update(resolved={"attempt": -1}), "attempt"),
        (lambda d: d.update(resolved={"unknown": "x"}), "unknown"),
    ],
)
def test_a_malformed_work_order_names_the_field(mutate: Any, expected: str) -> None:
    document = work_order_document(
        RolloutPool.model_validate(example("rolloutpool.yaml")), Resolved()
    )
    mutate(document)
    with pytest.raises(WorkOrderError, match=expected):
        WorkOrder.parse(document, RolloutPool)


def test_unreadable_work_orders_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkOrderError, match="cannot read work order"):
        WorkOrder.load(tmp_path / "missing.yaml", RolloutPool)
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    with pytest.raises(WorkOrderError, match="not YAML"):
        WorkOrder.load(broken, RolloutPool)
    broken.write_text("- a list\n")
    with pytest.raises(WorkOrderError, match="expected a mapping"):
        WorkOrder.load(broken, RolloutPool)


@pytest.mark.parametrize(
    ("command", "kind", "name"),
    [(["env", "serve"], RolloutPool, "rolloutpool.yaml"),
     (["device", "bridge", "--node", "n1"], DevicePool, "devicepool.yaml")],
)  # fmt: skip
def test_spec_commands_refuse_a_bad_work_order_with_the_field(
    command: list[str], kind: Any, name: str, tmp_path: Path
) -> None:
    document = work_order_document(kind.model_validate(example(name)), Resolved())
    document["spec"]["leaseDurationSeconds" if kind is DevicePool else "sessionTtlSeconds"] = -5
    path = tmp_path / "order.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(app, [*command, "--spec", str(path)])
    assert result.exit_code == 2
    field = "leaseDurationSeconds" if kind is DevicePool else "sessionTtlSeconds"
    assert f"spec.{field}" in result.output.replace("\n", "")


class _Shards(PodSummary):
    STAGE: ClassVar[str] = "test"
    done: int
    uris: list[str]


def test_a_summary_fits_the_termination_message_and_reads_back() -> None:
    summary = _Shards(done=3, uris=[f"s3://bucket/part-{i:05d}.jsonl" for i in range(400)])
    message = summary.to_message()
    assert len(message.encode()) <= 4096
    parsed = _Shards.from_message("log noise before it\n" + message)
    assert parsed is not None and parsed.done == 3
    assert parsed.uris[-1] == summary.uris[-1]  # the newest items survive
    assert _Shards.from_message('{"done": "many"}') is None
    assert _Shards.from_message("") is None and _Shards.from_message("no json") is None
