"""UI actions -> adb shell lines, device tool calls -> UI actions, and the device task world."""

from __future__ import annotations

import shlex

import pytest
from pydantic import ValidationError

from qpa.contract import Check, UIAction, VerifierSpec
from qpa.envs.device.actions import (
    DEVICE_TOOLS,
    InvalidAction,
    command_for,
    failure_of,
    to_ui_action,
)
from qpa.envs.device.tasks import device_tasks
from qpa.envs.device.verify import query_command, verify_device
from qpa.envs.device.world import DeviceWorld, seed_commands


def test_each_gesture_is_one_shell_line() -> None:
    assert command_for(UIAction(op="tap", x=10, y=20)) == "input tap 10 20"
    assert command_for(UIAction(op="swipe", x=1, y=2, x2=3, y2=4)) == "input swipe 1 2 3 4 300"
    assert command_for(UIAction(op="back")) == "input keyevent 4"
    assert command_for(UIAction(op="home")) == "input keyevent 3"
    assert command_for(UIAction(op="launch", package="com.a.b")).startswith("monkey -p com.a.b ")
    assert command_for(UIAction(op="launch", package="com.a.b", activity=".Main")) == (
        "am start -W -n com.a.b/.Main"
    )
    typed = command_for(UIAction(op="type", text="it's 5; rm -rf /"))
    assert shlex.split(typed) == ["input", "text", "it's%s5;%srm%s-rf%s/"]  # one argument
    intent = command_for(
        UIAction(op="intent", action="android.intent.action.SENDTO", data="smsto:Bob",
                 package="com.qpa.messages", extras={"sms_body": "hi $(reboot)"})
    )  # fmt: skip
    assert shlex.split(intent) == [
        "am", "start", "-W", "-a", "android.intent.action.SENDTO", "-d", "smsto:Bob",
        "-p", "com.qpa.messages", "--es", "sms_body", "hi $(reboot)",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("action", "words"),
    [
        (UIAction(op="tap", y=3), "needs 'x'"),
        (UIAction(op="swipe", x=1, y=2, x2=3), "needs 'y2'"),
        (UIAction(op="tap", x=-5, y=3), "'x' must be"),
        (UIAction(op="type"), "non-empty 'text'"),
        (UIAction(op="type", text="100%s"), "'%s'"),
        (UIAction(op="type", text="line\nbreak"), "ASCII"),
        (UIAction(op="launch"), "needs 'package'"),
        (UIAction(op="launch", package="com.a; reboot"), "'package'"),
        (UIAction(op="launch", package="com.a", activity="x y"), "'activity'"),
        (UIAction(op="intent"), "needs 'action'"),
        (UIAction(op="intent", action="a.B", extras={"bad key": "v"}), "'extras' key"),
    ],
)
def test_bad_actions_name_the_field(action: UIAction, words: str) -> None:
    with pytest.raises(InvalidAction, match=words.replace("(", r"\(")):
        command_for(action)


def test_device_tools_are_the_same_gestures() -> None:
    assert {t.name for t in DEVICE_TOOLS} == {
        "tap", "swipe", "type_text", "press_back", "press_home", "launch_app", "start_intent",
    }  # fmt: skip
    assert to_ui_action("type_text", {"text": "hi"}) == UIAction(op="type", text="hi")
    assert to_ui_action("start_intent", {"action": "a.B", "extras": {"k": "v"}}).extras == {
        "k": "v"
    }
    with pytest.raises(InvalidAction, match="'y' is a required property"):
        to_ui_action("tap", {"x": 1})
    with pytest.raises(InvalidAction, match="Additional properties"):
        to_ui_action("press_home", {"x": 1})
    with pytest.raises(InvalidAction, match=r"'extras\.k'"):
        to_ui_action("start_intent", {"action": "a.B", "extras": {"k": 1}})


def test_refusals_are_read_from_the_tools_output() -> None:
    launch = UIAction(op="launch", package="com.a.b")
    assert failure_of(launch, "** No activities found to run, monkey aborted.", "", 252)
    intent = UIAction(op="intent", action="a.B")
    assert failure_of(intent, "Starting: Intent\nError: Activity not started", "", 0) == (
        "Error: Activity not started"
    )
    assert failure_of(UIAction(op="tap", x=1, y=1), "", "", 0) is None
    assert failure_of(UIAction(op="tap", x=1, y=1), "", "Killed", 137) == "Killed"


def test_device_world_validates_and_seeds_with_typed_binds() -> None:
    world = DeviceWorld.model_validate(
        {"packages": ["com.qpa.notes"],
         "seed": {"content://com.qpa.notes.provider/notes": [
             {"title": "it's", "pinned": True, "rank": 2, "score": 0.5}]}}
    )  # fmt: skip
    [command] = seed_commands(world)
    assert shlex.split(command)[4:] == [
        "--bind", "title:s:it's", "--bind", "pinned:b:true", "--bind", "rank:i:2",
        "--bind", "score:d:0.5",
    ]  # fmt: skip
    with pytest.raises(ValidationError, match=r"packages\.0"):
        DeviceWorld.model_validate({"packages": ["rm -rf /"]})
    with pytest.raises(ValidationError, match="seed"):
        DeviceWorld.model_validate({"seed": {"http://x": []}})
    with pytest.raises(ValidationError, match="at least one column"):
        DeviceWorld.model_validate({"seed": {"content://a.b/c": [{}]}})


def test_verifier_targets_are_device_queries() -> None:
    assert (
        query_command("content://com.a.provider/x")
        == "content query --uri content://com.a.provider/x"
    )
    assert query_command("settings/global/airplane_mode_on") == (
        "settings get global airplane_mode_on"
    )
    assert query_command("prop/ro.product.model") == "getprop ro.product.model"
    with pytest.raises(ValueError, match="not a device query"):
        query_command("settings/global/x; reboot")

    answers = {
        "content query --uri content://m.p/messages": "Row: 0 _id=1, address=Bob, type=sent\n",
        "dumpsys window": "mCurrentFocus=Window{1 u0 com.qpa.notes/com.qpa.notes.Main}",
        "getprop ro.x": "\n",
    }
    spec = VerifierSpec(
        kind="device",
        checks=[
            Check(name="sent", target="content://m.p/messages", where={"address": "Bob"}),
            Check(name="fg", op="equals", target="foreground#package", expect="com.qpa.notes"),
            Check(name="prop", op="equals", target="prop/ro.x", expect=None),
            Check(name="bad", target="nowhere"),
        ],
        answer="done",
    )
    verification = verify_device(spec, answers.__getitem__, "All done.", finished=True)
    assert [c.passed for c in verification.checks] == [True, True, True, False, True]
    assert "not a device query" in verification.checks[3].detail
    assert verification.fidelity == "device" and not verification.success


def test_every_device_task_is_well_formed() -> None:
    tasks = device_tasks()
    assert len({t.id for t in tasks}) == len(tasks) >= 3
    for task in tasks:
        world = DeviceWorld.model_validate(task.world["_device"])
        assert set(task.apps) == set(world.packages)
        assert task.verifier.kind == "device" and task.verifier.checks
        for check in task.verifier.checks:
            query_command(check.target.partition("#")[0])
        for action in task.reference_plan or []:
            if isinstance(action, UIAction):
                command_for(action)
