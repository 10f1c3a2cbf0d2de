"""Environment kind `bfcl`: BFCL v4 multi-turn (bfcl-eval 2026.3.23) behind the contract, judged
by BFCL's own `multi_turn_checker`: its ground truth through the environment and through the
Harness runner, an idle planner, miss_func's withheld tools, bad worlds and arguments, splits,
the reviewed side effects, and episodes that must not leak into each other."""

from __future__ import annotations

import importlib
import math
import threading
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from qpa.contract import (
    Delegate,
    Environment,
    Finish,
    MessageUser,
    Task,
    ToolCall,
    UIAction,
    Verification,
)
from qpa.envs.bfcl import BFCL_CATEGORIES, BfclEnv, benchmark, bfcl_tasks, split_of
from qpa.envs.bfcl.calls import format_call, parse_call
from qpa.envs.bfcl.judge import _forget, judge
from qpa.envs.bfcl.schema import class_tools, json_schema
from qpa.envs.bfcl.tasks import ASK_FOR_MISSING, NO_FUNCTION
from qpa.envs.factory import make_env
from qpa.harness.factory import PlannerFactory, PlannerSpec
from qpa.harness.runner import run_episode

pytestmark = pytest.mark.timeout(120)

#: Where BFCL's own ground truth does not pass through qpa's environment (measured; not tuned).
#: BFCL's checker accepts all 800 ground truths as raw strings; these fail here because the
#: environment holds calls to BFCL's own function docs, which the ground truth breaks.
ORACLE_FAILURES: dict[str, str] = {
    # Scenario 173: the world's ticket id is the string 'ticket_001', the func doc says
    # `ticket_id: integer`; the ground truth's close_ticket(ticket_id='ticket_001') is refused
    # (invalid_arguments), so the turn has no call.
    **{
        f"bfcl.{c}.{c}_173": "multi_turn:empty_turn_model_response: Model response list is empty "
        f"for turn {4 if c in ('multi_turn_miss_func', 'multi_turn_miss_param') else 3}"
        for c in BFCL_CATEGORIES
    },
    # miss_func 49 withholds tail until turn 3, but its ground truth calls tail at turn 1.
    "bfcl.multi_turn_miss_func.multi_turn_miss_func_49": (
        "multi_turn:execution_response_mismatch: Model response execution results so far does "
        "not contain all the ground truth response execution results for turn 1."
    ),
}


def play(env: BfclEnv, task: Task, plan: list[Any]) -> Verification:
    assert env.reset(task).status == "ok"
    for action in plan:
        env.step(action)
    return env.verify()


def task_of(category: str, n: int) -> Task:
    return bfcl_tasks(category)[n]


# --------------------------------------------------------------------------- the judge


@pytest.mark.parametrize("category", BFCL_CATEGORIES)
def test_ground_truth_passes_bfcls_judge_and_finishing_at_once_fails(category: str) -> None:
    env = BfclEnv()
    tasks = bfcl_tasks(category)
    assert len(tasks) == 200
    failed: dict[str, str] = {}
    for task in tasks:
        verification = play(env, task, task.reference_plan or [])
        assert verification.done
        assert verification.checks[0].name == "multi_turn_checker"
        if not verification.success:
            failed[task.id] = verification.checks[0].detail
        else:
            assert verification.progress == 1.0 and verification.checks[0].passed
    expected = {k: v for k, v in ORACLE_FAILURES.items() if f".{category}." in k}
    assert set(failed) == set(expected), failed
    assert all(failed[k].startswith(v) for k, v in expected.items()), failed
    for task in tasks:
        noop = play(env, task, [Finish()])
        entry = benchmark.entry(category, task.lineage["entry_id"])
        turns = len(entry.turns)
        assert not noop.success
        assert noop.done == (turns == 1)  # a one-turn entry ends with its only turn
        # doing nothing is right only in a first turn no call can serve
        assert noop.progress == (0.0 if entry.ground_truth[0] else 1 / turns)
        detail = noop.checks[0].detail
        assert detail.startswith("multi_turn:empty_turn_model_response: Model response list is "), (
            task.id,
            detail,
        )


def test_the_oracle_planner_plays_a_whole_category_through_the_runner() -> None:
    factory = PlannerFactory(PlannerSpec(name="oracle"))
    env = make_env("bfcl")
    category = "multi_turn_miss_func"
    trajectories = [run_episode(env, task, factory()) for task in bfcl_tasks(category)]
    assert all(t.error is None and t.env_kind == "bfcl" for t in trajectories)
    failed = {t.task.id for t in trajectories if not t.success}
    assert failed == {k for k in ORACLE_FAILURES if f".{category}." in k}
    first = trajectories[0]
    assert first.tools and {t.name for t in first.tools} == set(first.task.tools)
    assert first.steps[-1].feedback.done


def test_progress_counts_the_turns_the_checker_accepts() -> None:
    task = task_of("multi_turn_base", 0)  # 4 turns, each with calls
    plan = task.reference_plan or []
    first_turn = plan[: plan.index(Finish()) + 1]
    env = BfclEnv()
    partial = play(env, task, [*first_turn, Finish(), Finish(), Finish()])
    assert partial.done and not partial.success
    assert partial.progress == pytest.approx(1 / 4)
    assert "for turn 1" in partial.checks[0].detail
    unfinished = play(env, task, first_turn)
    assert not unfinished.done and unfinished.progress == pytest.approx(1 / 4)


def test_a_wrong_call_fails_with_the_checkers_state_difference() -> None:
    task = task_of("multi_turn_base", 0)
    plan = list(task.reference_plan or [])
    plan[1] = ToolCall(tool="mkdir", arguments={"dir_name": "tmp"})  # not 'temp'
    verification = play(BfclEnv(), task, plan)
    assert not verification.success
    assert verification.checks[0].detail.startswith("multi_turn:")


def test_judge_runs_leave_no_backends_behind_and_agree_across_threads() -> None:
    utils = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    # The naming `_forget` relies on (bfcl-eval 2026.3.23): instances are module globals named
    # after the model name.
    utils.execute_multi_turn_func_call(
        ["ls()"], {}, ["GorillaFileSystem"], "qpa_bfcl_probe", "multi_turn_base_0"
    )
    assert [k for k in vars(utils) if k.startswith("qpa_bfcl_probe_")]
    _forget("qpa_bfcl_probe")
    assert not [k for k in vars(utils) if k.startswith("qpa_bfcl_")]

    tasks = [task_of(c, n) for c in BFCL_CATEGORIES for n in (0, 17, 90, 140)]
    alone = [play(BfclEnv(), t, t.reference_plan or []).success for t in tasks]
    results: dict[int, bool] = {}

    def worker(i: int) -> None:
        results[i] = play(BfclEnv(), tasks[i], tasks[i].reference_plan or []).success

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(tasks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(tasks))] == alone and all(alone)
    assert not [k for k in vars(utils) if k.startswith("qpa_bfcl_")]


def test_episodes_share_no_backend_state() -> None:
    """`post_tweet`'s list defaults are shared by every TwitterAPI and `mention` extends them in
    place: one episode's mention must not appear in another's (or its judge's) tweets."""
    task = next(
        t
        for t in bfcl_tasks("multi_turn_base")
        if "username"
        in benchmark.entry("multi_turn_base", t.lineage["entry_id"]).initial_config.get(
            "TwitterAPI", {}
        )
    )
    config = benchmark.entry("multi_turn_base", task.lineage["entry_id"]).initial_config
    login = {k: config["TwitterAPI"][k] for k in ("username", "password")}
    first, second = BfclEnv(), BfclEnv()
    for env in (first, second):
        assert env.reset(task).status == "ok"
        signed_in = env.step(ToolCall(tool="authenticate_twitter", arguments=login))
        assert signed_in.observation == {"authentication_status": True}
    posted = first.step(ToolCall(tool="post_tweet", arguments={"content": "hello"}))
    assert posted.status == "ok" and posted.observation["mentions"] == []
    tweet_id = posted.observation["id"]
    mention = {"tweet_id": tweet_id, "mentioned_usernames": ["@a"]}
    assert first.step(ToolCall(tool="mention", arguments=mention)).status == "ok"
    other = second.step(ToolCall(tool="post_tweet", arguments={"content": "hi"}))
    assert other.observation["mentions"] == []
    twitter = benchmark.backend_class("TwitterAPI")
    assert twitter.post_tweet.__defaults__ == ([], [])  # type: ignore[attr-defined]
    again = first.step(ToolCall(tool="get_tweet", arguments={"tweet_id": tweet_id}))
    assert again.observation["mentions"] == ["@a"]
    assert first.calls()[0][1] == "post_tweet(content='hello')"


# --------------------------------------------------------------------------- turns and tools


def test_miss_func_offers_withheld_functions_only_from_the_turn_that_brings_them() -> None:
    task = task_of("multi_turn_miss_func", 0)  # `sort` withheld until turn 3
    entry = benchmark.entry("multi_turn_miss_func", "multi_turn_miss_func_0")
    assert entry.missed == {3: ("sort",)}
    assert "sort" not in task.tools
    env = BfclEnv()
    first = env.reset(task)
    assert first.observation == {"user": task.instruction, "turn": 0, "turns": 5}
    for turn in (0, 1, 2):
        assert env.turn == turn and "sort" not in {t.name for t in env.tools()}
        refused = env.step(ToolCall(tool="sort", arguments={"file_name": "final_report.pdf"}))
        assert refused.error == "unknown_tool" and "sort" in refused.message
        feedback = env.step(Finish())
        assert feedback.status == "ok" and not feedback.done
    assert feedback.observation["turn"] == 3 and feedback.observation["tools_added"] == ["sort"]
    assert feedback.observation["user"] == (
        "I have updated some more functions you can choose from. What about now?"
    )  # BFCL's own prompt for a turn that only brings functions back
    assert "sort" in {t.name for t in env.tools()}
    # the plan tells the user at turn 2 that no function can do it
    plan = task.reference_plan or []
    assert MessageUser(text=NO_FUNCTION) in plan


def test_miss_param_asks_the_user_where_the_ground_truth_is_empty() -> None:
    task = task_of("multi_turn_miss_param", 0)
    entry = benchmark.entry("multi_turn_miss_param", "multi_turn_miss_param_0")
    empty = [i for i, calls in enumerate(entry.ground_truth) if not calls]
    assert empty == [3]
    closers = [a for a in task.reference_plan or [] if a.type in ("finish", "message_user")]
    assert closers[3] == MessageUser(text=ASK_FOR_MISSING)
    assert len(closers) == len(entry.turns)


def test_turns_end_on_finish_or_message_and_the_episode_on_the_last() -> None:
    task = task_of("multi_turn_base", 0)
    env = BfclEnv(max_steps=50)
    env.reset(task)
    assert env.step(MessageUser(text="done?")).observation["turn"] == 1
    assert env.step(Finish(answer="ok")).observation["turn"] == 2
    ui = env.step(UIAction(op="home"))
    delegated = env.step(Delegate(goal="x"))
    assert ui.error == delegated.error == "precondition_failed"
    assert not env.step(Finish()).done
    last = env.step(Finish())
    assert last.done and last.status == "ok" and env.finished
    after = env.step(ToolCall(tool="ls", arguments={}))
    assert after.error == "precondition_failed" and after.done


def test_the_step_budget_ends_the_episode() -> None:
    env = BfclEnv(max_steps=3)
    env.reset(task_of("multi_turn_base", 0))
    for _ in range(3):
        assert env.step(ToolCall(tool="pwd", arguments={})).status == "ok"
    stopped = env.step(ToolCall(tool="pwd", arguments={}))
    assert stopped.done and stopped.error == "precondition_failed" and "budget" in stopped.message
    assert not env.verify().done
    with pytest.raises(ValueError, match="max_steps"):
        BfclEnv(max_steps=0)


def test_calls_run_on_the_backend_and_are_recorded_in_bfcls_form() -> None:
    env = BfclEnv()
    env.reset(task_of("multi_turn_base", 0))
    listed = env.step(ToolCall(tool="ls", arguments={}))
    assert listed.status == "ok"
    assert listed.observation == {"current_directory_content": ["document", "archive"]}
    missing = env.step(ToolCall(tool="cd", arguments={"folder": "nowhere"}))
    assert missing.error == "precondition_failed" and "nowhere" in missing.message
    made = env.step(ToolCall(tool="mkdir", arguments={"dir_name": "new"}))
    assert made.status == "ok" and made.observation is None  # BFCL's mkdir returns None
    assert env.calls() == [["ls()", "cd(folder='nowhere')", "mkdir(dir_name='new')"]]


# --------------------------------------------------------------------------- refusals


def test_bad_world_ids_are_errors_naming_the_field() -> None:
    env = BfclEnv()
    base = task_of("multi_turn_base", 0)
    cases = {
        "world._bfcl: missing": {},
        "world._bfcl.category": {"_bfcl": {"category": "simple", "entry_id": "multi_turn_base_0"}},
        "world._bfcl.entry_id": {
            "_bfcl": {"category": "multi_turn_base", "entry_id": "multi_turn_base_999"}
        },
        "world._bfcl.initial_config": {
            "_bfcl": {
                "category": "multi_turn_base",
                "entry_id": "multi_turn_base_0",
                "initial_config": {"GorillaFileSystem": {}},
            }
        },
    }
    for field, world in cases.items():
        feedback = env.reset(base.model_copy(update={"world": world}))
        assert feedback.status == "error" and feedback.error == "invalid_arguments"
        assert feedback.message.startswith(field), feedback.message
        assert env.step(ToolCall(tool="ls", arguments={})).error == "precondition_failed"
        assert not env.verify().done and env.tools() == []
    # an entry of another category is not this category's
    mixed = {"_bfcl": {"category": "multi_turn_base", "entry_id": "multi_turn_miss_func_0"}}
    assert "world._bfcl.entry_id" in env.reset(base.model_copy(update={"world": mixed})).message


def test_bad_arguments_are_refused_naming_the_argument_and_never_run() -> None:
    env = BfclEnv()
    env.reset(task_of("multi_turn_base", 0))
    unknown = env.step(ToolCall(tool="rm_rf", arguments={}))
    assert unknown.error == "unknown_tool"
    missing = env.step(ToolCall(tool="cd", arguments={}))
    assert missing.error == "invalid_arguments" and "'folder'" in missing.message
    wrong = env.step(ToolCall(tool="tail", arguments={"file_name": "a", "lines": "ten"}))
    assert wrong.error == "invalid_arguments" and "lines" in wrong.message
    extra = env.step(ToolCall(tool="ls", arguments={"a": True, "path": "/"}))
    assert extra.error == "invalid_arguments" and "'path'" in extra.message
    nan = env.step(ToolCall(tool="tail", arguments={"file_name": "a", "lines": math.inf}))
    assert nan.error == "invalid_arguments"
    nullable = env.step(ToolCall(tool="echo", arguments={"content": "x", "file_name": None}))
    assert nullable.status == "ok" and nullable.observation == {"terminal_output": "x"}
    assert env.calls() == [["echo(content='x',file_name=None)"]]


# --------------------------------------------------------------------------- tasks and tools


def test_tasks_carry_ids_only_and_bfcls_lineage() -> None:
    with pytest.raises(KeyError, match=r"'simple'.*multi_turn_base, multi_turn_long_context"):
        bfcl_tasks("simple")
    assert bfcl_tasks("multi_turn_base") is bfcl_tasks("multi_turn_base")  # cached
    for category in BFCL_CATEGORIES:
        for task in bfcl_tasks(category):
            entry_id = task.lineage["entry_id"]
            entry = benchmark.entry(category, entry_id)
            assert task.id == f"bfcl.{category}.{entry_id}" and task.suite == f"bfcl/{category}"
            assert task.world == {"_bfcl": {"category": category, "entry_id": entry_id}}
            assert task.lineage == {
                "benchmark": "bfcl-eval",
                "version": "2026.3.23",
                "category": category,
                "entry_id": entry_id,
            }
            assert task.source == "bfcl" and task.capabilities == ["tool_use"]
            assert task.instruction == entry.turns[0] and task.apps == list(entry.involved_classes)
            assert 1 <= task.difficulty <= 5
            assert not set(task.tools) & entry.withheld
            assert task.domain in {benchmark.module_name(c) for c in entry.involved_classes}
    task = task_of("multi_turn_base", 0)
    assert task.domain == "gorilla_file_system"
    assert task.reference_plan is not None and task.reference_plan[0] == ToolCall(
        tool="cd", arguments={"folder": "document"}
    )
    trading = next(
        t for t in bfcl_tasks("multi_turn_base") if "place_order" in str(t.reference_plan)
    )
    assert "place_order" in trading.confirmations


def test_splits_are_deterministic_per_scenario_and_cover_all_three() -> None:
    assert [split_of(f"multi_turn_base_{i}") for i in range(8)] == [
        "train", "train", "train", "test", "train", "train", "test", "validation",
    ]  # fmt: skip
    by_scenario: dict[str, str] = {}
    for category in BFCL_CATEGORIES:
        for task in bfcl_tasks(category):
            scenario = task.lineage["entry_id"].rsplit("_", 1)[1]
            assert by_scenario.setdefault(scenario, task.split) == task.split
    counts = {s: list(by_scenario.values()).count(s) for s in ("train", "validation", "test")}
    assert counts == {"train": 123, "validation": 45, "test": 32}


def test_effects_table_covers_every_function_and_nothing_else() -> None:
    table = benchmark.effects()
    assert set(table) == set(benchmark.MULTI_TURN_CLASSES)
    for class_name in benchmark.MULTI_TURN_CLASSES:
        assert set(table[class_name]) == {d["name"] for d in benchmark.func_docs(class_name)}
    assert table["TradingBot"]["place_order"] == "payment"
    assert table["TravelAPI"]["book_flight"] == "payment"
    assert table["MessageAPI"]["send_message"] == "egress"
    assert table["GorillaFileSystem"]["ls"] == "read"
    involved = {
        c
        for category in BFCL_CATEGORIES
        for e in benchmark.entries(category).values()
        for c in e.involved_classes
    }
    assert involved == set(benchmark.MULTI_TURN_CLASSES)
    stale: dict[str, dict[str, str]] = {k: dict(v) for k, v in table.items()}
    stale["MathAPI"]["cube_root"] = "read"
    with pytest.raises(ValueError, match=r"MathAPI: unreviewed functions \[\], stale .*cube_root"):
        benchmark.check_effects(stale)
    missing: dict[str, dict[str, str]] = {k: dict(v) for k, v in table.items()}
    del missing["TradingBot"]["place_order"]
    with pytest.raises(ValueError, match=r"TradingBot: unreviewed functions \['place_order'\]"):
        benchmark.check_effects(missing)
    wrong: dict[str, dict[str, str]] = {k: dict(v) for k, v in table.items()}
    wrong["GorillaFileSystem"]["ls"] = "harmless"
    with pytest.raises(ValueError, match="unknown effects"):
        benchmark.check_effects(wrong)
    env = BfclEnv()
    env.reset(task_of("multi_turn_base", 0))
    assert all(t.side_effect == table[t.app][t.name] for t in env.tools())


def test_every_tool_declares_its_argument_roles_from_the_reviewed_table() -> None:
    table = benchmark.roles()
    effects = benchmark.effects()
    for class_name in benchmark.MULTI_TURN_CLASSES:
        writes = {f for f, e in effects[class_name].items() if e != "read"}
        assert writes <= set(table.get(class_name, {})), class_name
        for spec in class_tools(class_name):
            assert spec.roles is not None, (class_name, spec.name)
            assert set(spec.roles) <= set(spec.parameters["properties"]), spec.name
    env = BfclEnv()
    for category in BFCL_CATEGORIES:
        for task in bfcl_tasks(category)[:3]:
            env.reset(task)
            assert all(t.roles is not None for t in env.tools()), task.id
    specs = {(s.app, s.name): s for c in benchmark.MULTI_TURN_CLASSES for s in class_tools(c)}
    send = specs[("MessageAPI", "send_message")]
    assert send.role("receiver_id") == "recipient" and send.role("message") == "content"
    assert specs[("GorillaFileSystem", "rm")].role("file_name") == "destroyed"
    assert specs[("GorillaFileSystem", "touch")].role("file_name") == "free"  # a new file
    assert specs[("TradingBot", "place_order")].role("amount") == "amount"
    assert specs[("TwitterAPI", "authenticate_twitter")].role("password") == "credential"
    assert specs[("GorillaFileSystem", "ls")].roles == {}  # a read: declared, all free


def test_a_bad_roles_table_is_refused_naming_the_class_function_and_argument() -> None:
    def copy() -> dict[str, dict[str, dict[str, str]]]:
        return {c: {f: dict(r) for f, r in t.items()} for c, t in benchmark.roles().items()}

    unknown_argument = copy()
    unknown_argument["MessageAPI"]["send_message"]["cc"] = "recipient"
    with pytest.raises(
        ValueError, match=r"class MessageAPI\.send_message: unknown arguments \['cc'\]"
    ):
        benchmark.check_roles(unknown_argument)
    unknown_role = copy()
    unknown_role["GorillaFileSystem"]["rm"]["file_name"] = "victim"
    with pytest.raises(
        ValueError, match=r"GorillaFileSystem\.rm: unknown roles .*file_name.*victim"
    ):
        benchmark.check_roles(unknown_role)
    missing = copy()
    del missing["TravelAPI"]["book_flight"]
    with pytest.raises(ValueError, match=r"TravelAPI: state-changing .* \['book_flight'\]"):
        benchmark.check_roles(missing)
    stale = copy()
    stale["TicketAPI"]["get_ticket_by_magic"] = {}
    with pytest.raises(ValueError, match=r"TicketAPI: unknown tools \['get_ticket_by_magic'\]"):
        benchmark.check_roles(stale)
    with pytest.raises(ValueError, match=r"unknown class names \['WebSearchAPI'\]"):
        benchmark.check_roles({**copy(), "WebSearchAPI": {}})


def test_tools_are_valid_json_schema_in_plain_types() -> None:
    bfcl_only = {"dict", "float", "tuple", "any"}

    def types(schema: Any) -> set[str]:
        found: set[str] = set()
        if isinstance(schema, dict):
            kind = schema.get("type")
            found |= set(kind) if isinstance(kind, list) else {kind} if kind else set()
            for value in schema.values():
                found |= types(value)
        return found

    env = BfclEnv()
    seen = 0
    for class_name in benchmark.MULTI_TURN_CLASSES:
        task = next(t for t in bfcl_tasks("multi_turn_base") if class_name in t.apps)
        env.reset(task)
        for spec in env.tools():
            Draft202012Validator.check_schema(spec.parameters)
            Draft202012Validator.check_schema(spec.result)
            assert spec.parameters["type"] == "object" and not types(spec.parameters) & bfcl_only
            seen += 1
    assert seen > 100
    assert json_schema({"type": "tuple", "items": {"type": "float"}}) == {
        "type": "array", "items": {"type": "number"},
    }  # fmt: skip
    assert json_schema({"type": "any", "description": "d"}) == {"description": "d"}
    assert json_schema({"type": "string", "default": "None"}) == {
        "type": ["string", "null"], "default": None,
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"f\.x: unknown BFCL type 'complex'"):
        json_schema({"type": "dict", "properties": {"x": {"type": "complex"}}}, where="f")


def test_call_strings_round_trip() -> None:
    def names(function: str) -> tuple[str, ...]:
        return {"sort": ("file_name",), "f": ("a", "b")}[function]

    parsed = parse_call("sort('final_report.pdf')", names)
    assert parsed == ("sort", {"file_name": "final_report.pdf"})
    assert parse_call("f(1, b=[1, (2, 3)])", names) == ("f", {"a": 1, "b": [1, [2, 3]]})
    for bad in ("f(x=open('a'))", "os.system('x')", "f(**{'a': 1})", "1 + 1"):
        with pytest.raises(ValueError):
            parse_call(bad, names)
    assert format_call("cd", {"folder": "it's"}) == 'cd(folder="it\'s")'
    with pytest.raises(ValueError):
        format_call("cd", {"folder)\nimport os": 1})


def test_make_env_builds_it_with_no_options() -> None:
    env = make_env("bfcl")
    assert isinstance(env, Environment) and env.kind == "bfcl"
    assert isinstance(env, BfclEnv) and env.max_steps == 200
    assert env.verify() == Verification(done=False, success=False, progress=0.0)
    env.close()
    assert judge(benchmark.entry("multi_turn_base", "multi_turn_base_0"), []).turns_passed == 0
