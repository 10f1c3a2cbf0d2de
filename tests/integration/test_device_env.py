"""The device environment end to end: the real adb server, the test phone on the ADB wire.

Every episode goes `DeviceEnv` -> adbutils -> `adb server` (Debian's, on a free loopback port) ->
TCP transport -> `tests/fakes/adbd.py` -> the simulated phone, and back. Checked: the device
suite is solvable and its verifiers are not trivial; gestures, tool calls and intents change
the screen; bad actions are errors naming the field; a phone unplugged mid-episode ends the
episode as an environment failure (the trajectory is kept) and works again once re-plugged; a
hung phone times out; `qpa run --env device` runs a task on a phone by serial.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes.adbd import AdbPhone
from fakes.phone import MESSAGES, MESSAGES_URI
from typer.testing import CliRunner

from qpa.cli import app
from qpa.contract import Finish, ToolCall, UIAction, read_trajectories
from qpa.envs.device import DeviceEnv, device_tasks, get_device_task
from qpa.envs.factory import make_env
from qpa.harness.planners import NoopPlanner, OraclePlanner
from qpa.harness.runner import run_episode


@pytest.fixture
def env(adb_phone: AdbPhone) -> DeviceEnv:
    device = DeviceEnv(serial=adb_phone.serial, adb=adb_phone.adb_address, timeout=5)
    yield device
    device.close()


def tap_on(element: dict) -> ToolCall:
    return ToolCall(tool="tap", arguments={"x": element["center"][0], "y": element["center"][1]})


def elements(feedback) -> dict[str, dict]:
    return {e.get("text") or e.get("id", ""): e for e in feedback.observation["screen"]}


@pytest.mark.parametrize("task_id", [t.id for t in device_tasks()])
def test_the_device_suite_is_solvable_and_its_verifiers_are_not_trivial(
    env: DeviceEnv, adb_phone: AdbPhone, task_id: str
) -> None:
    task = get_device_task(task_id)
    solved = run_episode(env, task, OraclePlanner())
    assert solved.success, [c.model_dump() for c in solved.verification.checks]
    assert solved.env_kind == "device" and solved.verification.fidelity == "device"
    assert all(s.feedback.status == "ok" for s in solved.steps)
    # The next episode starts from the task's state again: nothing sent, nothing saved.
    idle = run_episode(env, task, NoopPlanner())
    assert not idle.success and idle.verification.progress < 1.0
    assert f"pm clear {task.apps[0]}" in adb_phone.phone.log


def test_observations_follow_the_screen_and_tool_calls_drive_it(
    env: DeviceEnv, adb_phone: AdbPhone
) -> None:
    task = get_device_task("device.messages.text_bob_running_late")
    first = env.reset(task)
    assert first.status == "ok" and first.observation["serial"] == adb_phone.serial
    assert first.observation["foreground"]["package"] == "com.android.launcher3"
    assert {"tap", "type_text", "start_intent"} <= {t.name for t in env.tools()}
    home = elements(first)
    opened = env.step(tap_on(home["Messages"]))
    assert opened.observation["foreground"]["package"] == MESSAGES
    bob = elements(opened)["Bob"]
    assert bob["clickable"] is True and bob["id"] == "conversation_name"
    chat = env.step(UIAction(op="tap", x=bob["center"][0], y=bob["center"][1]))
    assert chat.observation["foreground"]["activity"].endswith("ConversationActivity")
    compose = elements(chat)["compose"]
    focused = env.step(tap_on(compose))
    assert elements(focused)["compose"]["focused"] is True
    typed = env.step(ToolCall(tool="type_text", arguments={"text": "it's 5 o'clock & late"}))
    assert "it's 5 o'clock & late" in elements(typed)
    back = env.step(ToolCall(tool="press_back", arguments={}))
    assert back.observation["foreground"]["activity"].endswith("ConversationListActivity")
    home_again = env.step(UIAction(op="home"))
    assert home_again.observation["foreground"]["package"] == "com.android.launcher3"
    intent = env.step(
        UIAction(op="intent", action="android.intent.action.SENDTO", data="smsto:Carol",
                 package=MESSAGES, extras={"sms_body": "hi Carol"})
    )  # fmt: skip
    assert intent.status == "ok" and "hi Carol" in elements(intent)
    assert env.step(Finish()).done
    assert env.verify().success is False  # nothing was sent to Bob


def test_bad_actions_are_errors_naming_the_field(env: DeviceEnv) -> None:
    env.reset(get_device_task("device.notes.create_grocery_list"))
    cases = [
        (UIAction(op="tap", x=10), "invalid_arguments", "'y'"),
        (UIAction(op="type", text="héllo"), "invalid_arguments", "ASCII"),
        (UIAction(op="launch", package="not a package; rm -rf /"), "invalid_arguments", "package"),
        (ToolCall(tool="tap", arguments={"x": -1, "y": 2}), "invalid_arguments", "'x'"),
        (ToolCall(tool="tap", arguments={"x": 1}), "invalid_arguments", "'y' is a required"),
        (ToolCall(tool="send_sms", arguments={}), "unknown_tool", "send_sms"),
        (UIAction(op="launch", package="com.example.absent"), "precondition_failed", "monkey"),
        (UIAction(op="intent", action="android.intent.action.DIAL", package=MESSAGES),
         "precondition_failed", "No Activity"),
    ]  # fmt: skip
    for action, kind, words in cases:
        feedback = env.step(action)
        assert (feedback.status, feedback.error) == ("error", kind), (action, feedback)
        assert words in feedback.message, (action, feedback.message)
        assert not feedback.done


def test_a_phone_unplugged_mid_episode_is_an_environment_failure_then_comes_back(
    env: DeviceEnv, adb_phone: AdbPhone
) -> None:
    task = get_device_task("device.messages.text_bob_running_late")
    plan = list(task.reference_plan or [])

    class UnplugAfterTwo(OraclePlanner):
        def decide(self, last):  # type: ignore[no-untyped-def]
            if last is not None and last.index == 1:
                adb_phone.adbd.unplug()
            return super().decide(last)

    trajectory = run_episode(env, task, UnplugAfterTwo())
    failed = trajectory.steps[-1]
    assert len(trajectory.steps) == 3 and failed.action == plan[2]
    assert (failed.feedback.error, failed.feedback.done) == ("environment_failure", True)
    assert adb_phone.serial in failed.feedback.message
    assert not trajectory.success
    assert (
        trajectory.verification is not None and "gone" in trajectory.verification.checks[0].detail
    )
    assert env.step(plan[3]).error == "environment_failure"  # nothing pretends to work

    adb_phone.adbd.replug()
    adb_phone.server.command("disconnect", adb_phone.serial)
    adb_phone.server.connect(adb_phone.adbd)
    again = run_episode(env, task, OraclePlanner())
    assert again.success


def test_a_hung_phone_times_out_as_an_environment_failure(
    adb_phone: AdbPhone,
) -> None:
    env = DeviceEnv(serial=adb_phone.serial, adb=adb_phone.adb_address, timeout=0.5)
    assert env.reset(get_device_task("device.notes.create_grocery_list")).status == "ok"
    adb_phone.phone.hang_seconds = 1.0
    results = [env.step(UIAction(op="home")) for _ in range(3)]
    assert [r.error for r in results] == ["environment_failure"] * 3
    assert "timed out" in results[0].message
    assert [r.done for r in results] == [False, False, True]  # three in a row: the phone is lost
    adb_phone.phone.hang_seconds = 0.0
    env.close()


def test_screenshots_are_saved_and_referenced(adb_phone: AdbPhone, tmp_path: Path) -> None:
    env = make_env(
        "device", serial=adb_phone.serial, adb=adb_phone.adb_address, screenshot_dir=tmp_path
    )
    first = env.reset(get_device_task("device.notes.create_grocery_list"))
    shot = Path(first.observation["screenshot"].removeprefix("file://"))
    assert shot.is_file() and shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    env.close()


def test_one_phone_serves_one_environment_at_a_time(adb_phone: AdbPhone) -> None:
    from qpa.envs.device import FixedPhone

    phone = FixedPhone(adb_phone.serial, adb_phone.adb_address)
    first, second = DeviceEnv(phones=phone), DeviceEnv(phones=phone)
    task = get_device_task("device.notes.create_grocery_list")
    assert first.reset(task).status == "ok"
    busy = second.reset(task)
    assert busy.error == "environment_failure" and "in use by" in busy.message
    first.close()
    assert second.reset(task).status == "ok"
    second.close()


def test_verifiers_query_the_device(env: DeviceEnv, adb_phone: AdbPhone) -> None:
    task = get_device_task("device.messages.text_bob_running_late")
    env.reset(task)
    with adb_phone.phone.lock:
        adb_phone.phone.providers[MESSAGES_URI].insert(
            {"address": "Bob", "body": "Running 10 minutes late", "type": "sent"}
        )
    env.step(Finish())
    verification = env.verify()
    assert verification.success and verification.checks[0].detail == "1 matching"
    assert any(line.startswith("content query --uri") for line in adb_phone.phone.log)


def test_qpa_run_runs_a_task_on_a_phone(adb_phone: AdbPhone, tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    result = CliRunner().invoke(
        app,
        ["run", "--env", "device", "--task", "device.cross_app.text_alice_the_door_code",
         "--serial", adb_phone.serial, "--adb", adb_phone.adb_address, "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "SUCCESS" in result.output
    [trajectory] = read_trajectories(out)
    assert trajectory.env_kind == "device" and trajectory.success
    missing = CliRunner().invoke(app, ["run", "--env", "device", "--task",
                                       "device.notes.create_grocery_list"])  # fmt: skip
    assert missing.exit_code == 2 and "--serial" in missing.output
