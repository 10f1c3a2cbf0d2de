"""A TrainingRun is the ranks' input: every spec field reaches the SFT/RL config or the Job, and
what the API server accepts the trainer accepts (`from_trainingrun` never fails on a valid spec).

The work order is the one the operator's builder writes (`trainingrun.config_map`), read back
with `WorkOrder.parse`, as the pod does.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from qpa_operator.builders import trainingrun as builder
from qpa_operator.builders.common import Defaults, owner_namespace
from qpa_operator.builders.podtemplate import PodTemplateRefused

from qpa.api.v1alpha1 import (
    WORK_ORDER_KEY,
    CareSettings,
    TrainingRun,
    TrainingRunSpec,
    WorkOrder,
)
from qpa.train.care import care_group
from qpa.train.config import ConfigError, SFTConfig
from qpa.train.rl import RLConfig

#: The walk's alternative service account (`x-other`) is one the chart allows for pods.
D = Defaults(pod_service_accounts=("x-other",))
EXAMPLE = Path(__file__).parents[3] / "examples" / "trainingrun.yaml"
WORK = Path("/work")

#: Spec fields (and subtrees) that reach neither the stage's config nor the ranks' or data
#: Job, with where they go instead; tools/field_walk.py walks every child and the operator.
NOT_CARRIED: dict[tuple[str, ...], str] = {
    ("scheduling",): "the operator's gang admission and kept attempts (handlers.trainingrun)",
    ("rl", "generation"): "the rollout server's Deployment (builders.rolloutserver)",
    ("podTemplate",): "merged into every pod (builders.podtemplate, its own tests and the walk)",
}


def example(index: int) -> dict[str, Any]:
    doc: dict[str, Any] = list(yaml.safe_load_all(EXAMPLE.read_text()))[index]
    doc["metadata"] |= {"namespace": "team-a", "uid": f"uid-{index}"}
    return doc


def outputs_of(tr: TrainingRun) -> dict[str, Any]:
    """Everything the run's pods get, but the raw work order: the stage's config (as the pod
    builds it from the builder's work order), the ranks' Job and the data Job."""
    done = {
        ref.task_batch_ref.name: f"s3://qpa/taskbatches/{ref.task_batch_ref.name}/"
        for ref in tr.spec.datasets
        if ref.task_batch_ref is not None
    }
    plan = builder.data_plan(tr, done)
    cm = builder.config_map(tr, plan, D, attempt=0)
    order = WorkOrder.parse(yaml.safe_load(cm["data"][WORK_ORDER_KEY]), TrainingRun)
    stage = SFTConfig if tr.spec.stage == "sft" else RLConfig
    try:
        config: Any = stage.from_trainingrun(order, work_dir=WORK).model_dump()
    except ConfigError as exc:
        config = str(exc)
    return {
        "config": config,
        "job": builder.job(tr, 0, D),
        "data": builder.data_job(tr, plan, D),
    }


# --------------------------------------------------------------------------- the field walk


def _unwrap(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def leaves(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """(alias path, field info, annotation) of every leaf field; list items as index `*`."""
    for name, info in model.model_fields.items():
        alias = info.alias or name
        annotation = _unwrap(info.annotation)
        if _is_model(annotation):
            yield from leaves(annotation, (*path, alias))
        elif get_origin(annotation) is list and _is_model(_unwrap(get_args(annotation)[0])):
            yield from leaves(_unwrap(get_args(annotation)[0]), (*path, alias, "*"))
        else:
            yield (*path, alias), info, annotation


def candidates(alias: str, info: FieldInfo, annotation: Any, current: Any) -> list[Any]:
    """Other values for a leaf, most likely valid first."""
    if annotation is bool:
        return [not current] if current is not None else [True, False]
    if get_origin(annotation) is Literal:
        return [c for c in get_args(annotation) if c != current]
    if annotation is int:
        return [current + 1, current - 1, 2] if current is not None else [5, 1]
    if annotation is float:
        return [current / 2, current * 0.9, current + 1, 0.5] if current else [0.5, 0.05]
    if get_origin(annotation) is dict:
        return [{"cpu": "2"}, {"cpu": "64"}, {"memory": "300Gi"}]
    if alias in ("workSize", "sizeLimit"):
        return ["7Gi"]
    if alias.lower().endswith("uri") or alias == "resumeFrom":
        return ["s3://qpa/other/checkpoint-7/", "file:///tmp/other/"]
    if alias == "endpoint":
        return ["http://other-store:9000"]
    if alias == "image":
        return ["registry.example.com/trainer:2"]
    return [f"{current or 'x'}-other"]


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any, index: int) -> bool:
    node: Any = data
    for part in path[:-1]:
        if part == "*":
            if not isinstance(node, list) or index >= len(node):
                return False
            node = node[index]
            continue
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
    node[path[-1]] = value
    return True


def _get(data: dict[str, Any], path: tuple[str, ...], index: int) -> Any:
    node: Any = data
    for part in path:
        if part == "*":
            node = node[index] if isinstance(node, list) and index < len(node) else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def test_every_spec_field_reaches_the_pods() -> None:
    bases = [example(0), example(1)]
    before = [outputs_of(TrainingRun.model_validate(doc)) for doc in bases]
    missed: list[str] = []
    for path, info, annotation in leaves(TrainingRunSpec):
        dotted = ".".join(path)
        if path == ("stage",):  # selects the trainer: different commands, checked below
            continue
        changed = False
        for base, seen in zip(bases, before, strict=True):
            for index in (0, 1):
                current = _get(base["spec"], path, index)
                if current is None and not info.is_required():
                    current = info.get_default(call_default_factory=True)
                for value in candidates(path[-1], info, annotation, current):
                    doc = copy.deepcopy(base)
                    if not _set(doc["spec"], path, value, index):
                        break
                    try:
                        outputs = outputs_of(TrainingRun.model_validate(doc))
                    except (ValidationError, PodTemplateRefused):  # a value the operator refuses
                        continue
                    changed = changed or outputs != seen
                    break
        key = tuple(p for p in path if p != "*")
        carried_elsewhere = any(key[: len(prefix)] == prefix for prefix in NOT_CARRIED)
        if not changed and not carried_elsewhere:
            missed.append(dotted)
    assert not missed, f"spec fields that change neither config nor Job: {missed}"
    sft, rl = (TrainingRun.model_validate(doc) for doc in bases)
    assert builder.train_args(sft, 0, D)[-3] == "sft" and builder.train_args(rl, 0, D)[-3] == "rl"


def test_work_order_maps_the_spec() -> None:
    sft_tr, rl_tr = (TrainingRun.model_validate(example(i)) for i in (0, 1))
    sft = outputs_of(sft_tr)["config"]
    assert sft["dataset"] == "s3://qpa/default/trainingruns/planner-sft/data/mix/"
    assert sft["checkpoint"] | {"save_final": True} == {
        "every_steps": 200,
        "keep_last": 3,
        "store": "s3://qpa",
        "prefix": "default/trainingruns/planner-sft",
        "resume": "auto",
        "resume_from": None,
        "save_final": True,
    }
    assert sft["deepspeed"]["zero_stage"] == 3 and sft["deepspeed"]["offload_optimizer"]
    assert sft["max_length"] == 16384 and sft["gradient_accumulation_steps"] == 16
    assert sft["sft"] == {"turn_masking": True} and sft["output_dir"] == "/work/run"
    rl = outputs_of(rl_tr)["config"]
    assert rl["samples_per_task"] == 8 and rl["steps"] == 2000
    namespace = owner_namespace(rl_tr)
    assert rl["env"]["urls"] == [builder.rollout_pool_url("sandbox", namespace, D)]
    assert rl["care"] == CareSettings.model_validate(example(1)["spec"]["rl"]["care"]).model_dump()
    assert rl["tasks"]["generator"] is not None and rl["tasks"]["split"] == "train"


def test_resume_from_applies_to_the_first_attempt_only() -> None:
    doc = example(0)
    doc["spec"]["resumeFrom"] = "s3://qpa/trainingruns/x/checkpoints/checkpoint-10/"
    tr = TrainingRun.model_validate(doc)
    plan = builder.data_plan(tr, {"nightly-tool-use": "s3://qpa/taskbatches/n/"})
    for attempt, expected in ((0, doc["spec"]["resumeFrom"]), (1, None)):
        cm = builder.config_map(tr, plan, D, attempt=attempt)
        order = WorkOrder.parse(yaml.safe_load(cm["data"][WORK_ORDER_KEY]), TrainingRun)
        assert SFTConfig.from_trainingrun(order).checkpoint.resume_from == expected


def test_success_anchor_changes_the_advantages() -> None:
    """`spec.rl.care.successAnchor` reaches the trainer and changes what a group pushes."""
    from qpa.train.care import Outcome

    group = [Outcome(True, 1.0, 100, 2), Outcome(True, 1.0, 101, 2)]
    doc = example(1)
    results = []
    for anchor in (True, False):
        doc["spec"]["rl"]["care"]["successAnchor"] = anchor
        config = RLConfig.model_validate(outputs_of(TrainingRun.model_validate(doc))["config"])
        results.append(care_group(group, config.care).advantages)
    assert abs(results[1][0]) > 100 * abs(results[0][0])


def test_orders_of_the_wrong_stage_or_unresolved_are_refused() -> None:
    sft = TrainingRun.model_validate(example(0))
    order = WorkOrder.parse(
        {**sft.to_k8s(), "resolved": {"datasetUri": None}}, TrainingRun, source="order"
    )
    with pytest.raises(ConfigError, match=r"resolved\.datasetUri"):
        SFTConfig.from_trainingrun(order)
    with pytest.raises(ConfigError, match=r"spec\.stage"):
        RLConfig.from_trainingrun(order)
    rl = TrainingRun.model_validate(example(1))
    unresolved = WorkOrder.parse({**rl.to_k8s(), "resolved": {}}, TrainingRun)
    with pytest.raises(ConfigError, match=r"resolved\.rolloutPoolUrl"):
        RLConfig.from_trainingrun(unresolved)


# --------------------------------------------------------------------------- CRD bounds


def _strategy(annotation: Any, info: FieldInfo | None) -> st.SearchStrategy[Any] | None:
    """Values of one field within its declared bounds (pydantic metadata)."""
    annotation = _unwrap(annotation)
    bounds: dict[str, Any] = {}
    for item in info.metadata if info is not None else ():
        for key in ("ge", "gt", "le", "lt", "max_length", "pattern"):
            if getattr(item, key, None) is not None:
                bounds[key] = getattr(item, key)
    if annotation is bool:
        return st.booleans()
    if get_origin(annotation) is Literal:
        return st.sampled_from(get_args(annotation))
    if annotation is int:
        low = bounds.get("ge", bounds["gt"] + 1 if "gt" in bounds else 0)
        high = bounds.get("le", bounds["lt"] - 1 if "lt" in bounds else low + 100_000)
        return st.integers(min_value=low, max_value=high)
    if annotation is float:
        return st.floats(
            min_value=bounds.get("ge", bounds.get("gt", 0.0)),
            max_value=bounds.get("le", bounds.get("lt", 1e6)),
            exclude_min="gt" in bounds,
            exclude_max="lt" in bounds,
            allow_nan=False,
        )
    if _is_model(annotation):
        return _model_strategy(annotation)
    return None


def _model_strategy(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """A wire-form dict of `model`: each numeric, boolean or enum field drawn within its bounds
    or left to its default; other fields keep the example's values."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, info in model.model_fields.items():
        strategy = _strategy(info.annotation, info)
        if strategy is not None:
            fields[info.alias or name] = strategy
    return st.fixed_dictionaries({}, optional=fields)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    stage=st.sampled_from([0, 1]),
    hyperparameters=_model_strategy(TrainingRunSpec.model_fields["hyperparameters"].annotation),
    deepspeed=_model_strategy(TrainingRunSpec.model_fields["deepspeed"].annotation),
    care=_model_strategy(CareSettings),
    rl=st.fixed_dictionaries(
        {},
        optional={
            "samplesPerTask": st.integers(2, 256),
            "tasksPerStep": st.integers(1, 4096),
            "maxTurns": st.integers(1, 1000),
        },
    ),
    top=st.fixed_dictionaries(
        {},
        optional={
            "checkpointEvery": st.integers(1, 10**9),
            "keepCheckpoints": st.integers(1, 1000),
            "resume": st.booleans(),
            "nodes": st.integers(1, 512),
            "gpusPerNode": st.integers(0, 16),
            "backoffLimit": st.integers(0, 100),
        },
    ),
    sft=st.fixed_dictionaries({}, optional={"turnMasking": st.booleans()}),
)
def test_what_the_api_accepts_the_trainer_accepts(
    stage: int,
    hyperparameters: dict[str, Any],
    deepspeed: dict[str, Any],
    care: dict[str, Any],
    rl: dict[str, Any],
    top: dict[str, Any],
    sft: dict[str, Any],
) -> None:
    doc = example(stage)
    spec = doc["spec"]
    spec.update(top)
    spec["hyperparameters"] = hyperparameters
    spec["deepspeed"] = deepspeed
    if stage == 0:
        spec["sft"] = sft
    else:
        spec["rl"] = {**spec["rl"], **rl, "care": care}
    try:
        tr = TrainingRun.model_validate(doc)
    except ValidationError:
        assume(False)  # a spec the API server refuses (a CrossFieldRule)
        return
    config = outputs_of(tr)["config"]
    assert isinstance(config, dict), config  # never a ConfigError


# --------------------------------------------------------------------------- the CLI


def test_qpa_train_rl_reads_the_work_order(tmp_path: Path) -> None:
    """`qpa train rl --spec` (a dry run: settings and task pool, no training)."""
    from typer.testing import CliRunner

    import qpa.cli.train_rl  # noqa: F401  (registers `qpa train rl`)
    from qpa.cli import app

    tr = TrainingRun.model_validate(example(1))
    cm = builder.config_map(tr, builder.data_plan(tr, {}), D, attempt=0)
    order = tmp_path / "workorder.yaml"
    order.write_text(cm["data"][WORK_ORDER_KEY])
    result = CliRunner().invoke(app, ["train", "rl", "--spec", str(order), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert '"episodes_per_step": 64' in result.output  # tasksPerStep 8 x samplesPerTask 8
    assert builder.rollout_pool_url("sandbox", owner_namespace(tr), D) in result.output
    both = ["train", "rl", "--spec", str(order), "--config", str(order)]
    assert CliRunner().invoke(app, both).exit_code != 0
    wrong = CliRunner().invoke(app, ["train", "sft", "--spec", str(order), "--dry-run"])
    assert wrong.exit_code != 0 and "spec.stage is rl" in wrong.output
