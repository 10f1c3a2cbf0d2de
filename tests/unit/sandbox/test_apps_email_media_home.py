"""Email, music, podcasts and home apps and the email / media / smart_home task templates."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers.sandbox_steps import fails, ok, open_env

from qpa.contract import SPLITS, Check, Finish, MemoryItem, Task, ToolCall
from qpa.envs.sandbox import SandboxEnv
from qpa.envs.sandbox.authoring import conflicting_memory, memory_winner
from qpa.envs.sandbox.registry import all_apps, all_tools
from qpa.envs.sandbox.suite import CANONICAL_SEED, all_templates, build_task
from qpa.envs.sandbox.templates.email import ACCOUNTS, PERSONAL, WORK, mail
from qpa.envs.sandbox.templates.media import build_catalog, playlist
from qpa.envs.sandbox.templates.smart_home import HomeBuilder
from qpa.harness.planners import make_planner
from qpa.harness.runner import run_episode

DOMAINS = ("email", "media", "smart_home")
APPS = ("email", "music", "podcasts", "home")


@functools.cache
def _built() -> tuple[Task, ...]:
    """The canonical tasks of these domains, built exactly as `generate_suite` builds them
    (per template and split, skipping duplicate instructions), but without building other
    domains' templates."""
    tasks: list[Task] = []
    for tpl in all_templates().values():
        if tpl.domain not in DOMAINS:
            continue
        seen: set[str] = set()
        for split in SPLITS:
            index = made = attempts = 0
            while made < tpl.counts[split] and attempts < tpl.counts[split] * 20:
                attempts += 1
                task = build_task(tpl, split, index, CANONICAL_SEED)
                index += 1
                if task.instruction in seen:
                    continue
                seen.add(task.instruction)
                tasks.append(task)
                made += 1
    return tuple(tasks)


def _tasks() -> list[Task]:
    return list(_built())


def _open(apps: list[str], world: dict[str, Any]) -> SandboxEnv:
    task = Task(
        id=f"unit.{'-'.join(apps)}",
        domain="unit",
        capabilities=["tool_use"],
        instruction="unit test",
        apps=apps,
        world=world,
    )
    return open_env(task)


# --------------------------------------------------------------------------- registry


def test_apps_register_enough_well_formed_tools() -> None:
    apps = all_apps()
    names = [name for app in APPS for name in apps[app].bound_tools]
    assert len(names) >= 50
    for name in names:
        spec = all_tools()[name].spec
        assert name.startswith(f"{spec.app}_"), name
        assert spec.result, f"{name} has no result schema"
        assert spec.description and not spec.description.startswith(name)
        assert spec.parameters.get("additionalProperties") is False
    for app in APPS:
        assert apps[app].skills, f"{app} ships no skill"


def test_schemas_carry_ranges_enums_and_patterns() -> None:
    tools = all_tools()
    volume = tools["music_set_volume"].spec.parameters["properties"]["level"]
    assert (volume["minimum"], volume["maximum"]) == (0, 100)
    folder = tools["email_move"].spec.parameters["properties"]["folder"]
    assert "archive" in folder["enum"]
    start = tools["email_set_auto_reply"].spec.parameters["properties"]["start"]
    assert start["pattern"].startswith("^\\d{4}")
    speed = tools["podcasts_set_playback"].spec.parameters["properties"]["speed"]["anyOf"][0]
    assert (speed["minimum"], speed["maximum"]) == (0.5, 3.0)
    assert "limit" in tools["email_search"].spec.parameters["properties"]
    assert "offset" in tools["music_search"].spec.parameters["properties"]
    assert tools["home_set_security"].spec.side_effect == "write"


# --------------------------------------------------------------------------- email app


def _email_world() -> dict[str, Any]:
    invoice = mail(
        "em_1",
        PERSONAL,
        "Acme",
        "billing@acme.com",
        "Your February invoice #123",
        "Invoice attached.",
        "2026-02-20T08:00",
        attachments=[
            {"id": "att_pdf", "name": "invoice.pdf", "size_kb": 300, "mime": "application/pdf"},
            {"id": "att_zip", "name": "photos.zip", "size_kb": 30000, "mime": "application/zip"},
        ],
    )
    news = mail(
        "em_2",
        PERSONAL,
        "Deals",
        "news@deals.com",
        "Sale",
        "50% off.",
        "2026-02-21T08:00",
        list_unsubscribe=True,
        read=False,
    )
    work = mail(
        "em_3",
        WORK,
        "Dana Diaz",
        "dana@corp.com",
        "Budget",
        "Numbers inside.",
        "2026-02-22T08:00",
        read=False,
    )
    return {"accounts": [dict(a) for a in ACCOUNTS], "messages": [invoice, news, work]}


def test_email_reading_and_pagination() -> None:
    env = _open(["email"], {"email": _email_world()})
    accounts = ok(env, "email_list_accounts")
    assert {a["address"]: a["unread"] for a in accounts}[WORK] == 1
    page = ok(env, "email_list", limit=1, offset=1)
    assert [m["id"] for m in page] == ["em_2"]
    assert ok(env, "email_list", account=WORK)[0]["attachment_count"] == 0
    assert [m["id"] for m in ok(env, "email_search", has_attachment=True)] == ["em_1"]
    assert ok(env, "email_search", query="invoice", after="2026-02-21") == []
    full = ok(env, "email_get", message_id="em_3")
    assert full["read"] is True and full["body"] == "Numbers inside."
    assert len(ok(env, "email_get_thread", thread_id="th_em_3")) == 1
    fails(env, "email_get_thread", "precondition_failed", "not found", thread_id="th_nope")
    fails(env, "email_list", "precondition_failed", "unknown account", account="x@y.com")


def test_email_forward_attachment_rules() -> None:
    env = _open(["email"], {"email": _email_world()})
    fails(
        env,
        "email_forward",
        "precondition_failed",
        "attachment too large",
        message_id="em_1",
        to=["t@x.com"],
        attachment_ids=["att_pdf", "att_zip"],
    )
    fails(
        env,
        "email_forward",
        "precondition_failed",
        "not part of message",
        message_id="em_1",
        to=["t@x.com"],
        attachment_ids=["att_other"],
    )
    sent = ok(env, "email_forward", message_id="em_1", to=["t@x.com"], attachment_ids=["att_pdf"])
    assert sent["subject"].startswith("Fwd:") and [a["id"] for a in sent["attachments"]] == [
        "att_pdf"
    ]
    fails(
        env,
        "email_send",
        "invalid_arguments",
        "'to.0'",
        to=["not-an-address"],
        subject="s",
        body="b",
    )


def test_email_labels_filters_and_housekeeping() -> None:
    env = _open(["email"], {"email": _email_world()})
    fails(
        env,
        "email_apply_label",
        "precondition_failed",
        "unknown label",
        message_ids=["em_1"],
        label="Finance",
    )
    fails(env, "email_create_label", "precondition_failed", "parent label", name="Finance/2026")
    ok(env, "email_create_label", name="Finance", color="green")
    ok(env, "email_create_label", name="Finance/2026")
    fails(env, "email_create_label", "precondition_failed", "already exists", name="Finance")
    ok(env, "email_apply_label", message_ids=["em_1", "em_2"], label="Finance/2026")
    ok(env, "email_remove_label", message_ids=["em_2"], label="Finance/2026")
    labels = {lb["name"]: lb["messages"] for lb in ok(env, "email_list_labels")}
    assert labels == {"Finance": 0, "Finance/2026": 1}
    assert [m["id"] for m in ok(env, "email_list", label="Finance/2026")] == ["em_1"]
    fails(env, "email_create_filter", "invalid_arguments", "from_contains", action="archive")
    fails(
        env,
        "email_create_filter",
        "precondition_failed",
        "unknown label",
        from_contains="acme.com",
        action="label",
        label="Bills",
    )
    rule = ok(env, "email_create_filter", from_contains="acme.com", action="label", label="Finance")
    assert [f["id"] for f in ok(env, "email_list_filters")] == [rule["id"]]
    ok(env, "email_delete_filter", filter_id=rule["id"])
    assert ok(env, "email_list_filters") == []
    ok(env, "email_mark", message_ids=["em_2"], starred=True, read=True)
    fails(env, "email_mark", "invalid_arguments", "nothing to change", message_ids=["em_2"])
    ok(env, "email_move", message_ids=["em_2"], folder="archive")
    ok(env, "email_delete", message_ids=["em_3"])
    ok(env, "email_delete", message_ids=["em_3"])  # second time: gone for good
    state = env.state()["email"]
    assert {m["id"]: m["folder"] for m in state["messages"]} == {"em_1": "inbox", "em_2": "archive"}


def test_email_drafts_schedule_auto_reply_block_unsubscribe() -> None:
    env = _open(["email"], {"email": _email_world()})
    draft = ok(env, "email_create_draft", subject="Plan")
    fails(env, "email_send_draft", "precondition_failed", "no recipients", draft_id=draft["id"])
    draft2 = ok(env, "email_create_draft", to=["sam@x.com"], subject="Hi", body="Hello")
    assert ok(env, "email_send_draft", draft_id=draft2["id"])["folder"] == "sent"
    fails(env, "email_send_draft", "precondition_failed", "not a draft", draft_id=draft2["id"])
    fails(
        env,
        "email_schedule_send",
        "precondition_failed",
        "not in the future",
        to=["sam@x.com"],
        subject="s",
        body="b",
        send_at="2026-03-01T08:00",
    )
    later = ok(
        env,
        "email_schedule_send",
        to=["sam@x.com"],
        subject="s",
        body="b",
        send_at="2026-03-03T08:00",
    )
    assert later["folder"] == "scheduled" and later["scheduled_for"] == "2026-03-03T08:00"
    fails(
        env,
        "email_set_auto_reply",
        "precondition_failed",
        "before start",
        account=WORK,
        start="2026-03-10",
        end="2026-03-05",
        message="away",
    )
    ok(
        env,
        "email_set_auto_reply",
        account=WORK,
        start="2026-03-05",
        end="2026-03-10",
        message="away",
    )
    fails(
        env,
        "email_set_auto_reply",
        "precondition_failed",
        "disable it first",
        account=WORK,
        start="2026-03-11",
        end="2026-03-12",
        message="away",
    )
    ok(env, "email_disable_auto_reply", account=WORK)
    fails(env, "email_disable_auto_reply", "precondition_failed", "no active", account=WORK)
    fails(env, "email_unsubscribe", "precondition_failed", "no unsubscribe link", message_id="em_1")
    assert ok(env, "email_unsubscribe", message_id="em_2")["sender"] == "news@deals.com"
    assert ok(env, "email_block_sender", address="dana@corp.com")["moved_to_spam"] == 1
    fails(
        env,
        "email_send",
        "precondition_failed",
        "blocked",
        to=["dana@corp.com"],
        subject="s",
        body="b",
    )
    fails(env, "email_reply", "precondition_failed", "draft", message_id=draft["id"], body="x")


# --------------------------------------------------------------------------- music app


def _music_world(region: str = "US") -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    import random

    catalog, by_artist = build_catalog(
        random.Random(3),
        ["Mara Quinn", "Solenne"],
        region,
        per_artist=4,
        unavailable={"Mara Quinn": [0]},
    )
    good = by_artist["Solenne"]
    world = {
        "account": {"user": "Alex", "region": region, "plan": "premium", "explicit_filter": False},
        "catalog": catalog,
        "playlists": [
            playlist("pl_1", "Road Trip", [good[0]["id"]]),
            playlist("pl_full", "Tiny", [good[1]["id"]], max_tracks=1),
        ],
        "devices": [
            {
                "id": "dev_phone",
                "name": "This phone",
                "kind": "phone",
                "status": "online",
                "volume": 50,
            },
            {
                "id": "dev_k",
                "name": "Kitchen Speaker",
                "kind": "speaker",
                "status": "standby",
                "volume": 30,
            },
            {
                "id": "dev_off",
                "name": "Patio Speaker",
                "kind": "speaker",
                "status": "offline",
                "volume": 30,
            },
        ],
    }
    return world, by_artist


def test_music_region_capacity_and_playlists() -> None:
    world, by_artist = _music_world()
    env = _open(["music"], {"music": world})
    blocked, playable = by_artist["Mara Quinn"][0], by_artist["Mara Quinn"][1]
    assert ok(env, "music_get_account")["region"] == "US"
    assert (
        ok(env, "music_artist_top_tracks", artist="mara quinn", limit=1)[0]["id"] == blocked["id"]
    )
    fails(env, "music_artist_top_tracks", "precondition_failed", "no artist", artist="Nobody")
    fails(
        env,
        "music_add_tracks",
        "precondition_failed",
        "not available in region",
        playlist_id="pl_1",
        track_ids=[playable["id"], blocked["id"]],
    )
    fails(
        env,
        "music_add_tracks",
        "precondition_failed",
        "playlist full",
        playlist_id="pl_full",
        track_ids=[playable["id"]],
    )
    added = ok(
        env, "music_add_tracks", playlist_id="pl_1", track_ids=[playable["id"], playable["id"]]
    )
    assert added["added"] == [playable["id"]] and added["skipped_duplicates"] == [playable["id"]]
    assert ok(env, "music_get_track", track_id=playable["id"])["title"] == playable["title"]
    detail = ok(env, "music_get_playlist", playlist_id="pl_1")
    assert detail["track_count"] == 2 and detail["tracks"][1]["id"] == playable["id"]
    ok(env, "music_remove_tracks", playlist_id="pl_1", track_ids=[playable["id"]])
    fails(
        env,
        "music_remove_tracks",
        "precondition_failed",
        "not in playlist",
        playlist_id="pl_1",
        track_ids=[playable["id"]],
    )
    new = ok(env, "music_create_playlist", name="Focus", public=True)
    fails(env, "music_create_playlist", "precondition_failed", "already exists", name="focus")
    fails(
        env,
        "music_update_playlist",
        "precondition_failed",
        "must be private",
        playlist_id=new["id"],
        collaborative=True,
    )
    renamed = ok(
        env,
        "music_update_playlist",
        playlist_id=new["id"],
        name="Deep Focus",
        public=False,
        collaborative=True,
    )
    assert renamed["name"] == "Deep Focus" and renamed["collaborative"] is True
    ok(env, "music_delete_playlist", playlist_id=new["id"])
    assert [p["id"] for p in ok(env, "music_list_playlists")] == ["pl_1", "pl_full"]
    assert ok(env, "music_search", query=playable["title"])[0]["id"] == playable["id"]


def test_music_devices_playback_and_library() -> None:
    world, by_artist = _music_world()
    env = _open(["music"], {"music": world})
    track = by_artist["Solenne"][0]
    fails(
        env,
        "music_play",
        "precondition_failed",
        "standby",
        context_id=track["id"],
        device_id="dev_k",
    )
    fails(env, "music_wake_device", "precondition_failed", "device offline", device_id="dev_off")
    fails(
        env,
        "music_set_volume",
        "precondition_failed",
        "device offline",
        level=40,
        device_id="dev_off",
    )
    fails(env, "music_set_volume", "invalid_arguments", "level", level=150)
    fails(env, "music_pause", "precondition_failed", "nothing is playing")
    ok(env, "music_wake_device", device_id="dev_k")
    fails(
        env,
        "music_play",
        "precondition_failed",
        "not available in region",
        context_id=by_artist["Mara Quinn"][0]["id"],
    )
    playing = ok(env, "music_play", context_id="pl_1", device_id="dev_k", shuffle=True)
    assert playing["track"]["id"] == track["id"] and playing["device_id"] == "dev_k"
    assert ok(env, "music_set_volume", level=65)["volume"] == 65
    assert ok(env, "music_now_playing")["state"] == "playing"
    assert ok(env, "music_pause")["state"] == "paused"
    assert ok(env, "music_queue_add", track_id=track["id"])["position"] == 1
    ok(env, "music_like_track", track_id=track["id"])
    fails(env, "music_like_track", "precondition_failed", "already liked", track_id=track["id"])
    assert [t["id"] for t in ok(env, "music_list_liked")] == [track["id"]]
    ok(env, "music_unlike_track", track_id=track["id"])
    fails(env, "music_unlike_track", "precondition_failed", "not in Liked", track_id=track["id"])
    assert ok(env, "music_recently_played", limit=1)[0]["track_id"] == track["id"]


# --------------------------------------------------------------------------- podcasts app


def _podcast_world() -> dict[str, Any]:
    shows = [
        {
            "id": "sh_1",
            "title": "Deep Field",
            "publisher": "Orbit",
            "category": "science",
            "description": "",
        },
        {
            "id": "sh_2",
            "title": "Extra Time",
            "publisher": "Pitchside",
            "category": "sports",
            "description": "",
        },
    ]
    episodes = [
        {
            "id": f"ep_{i}",
            "show_id": "sh_1" if i < 3 else "sh_2",
            "title": f"Ep {i}",
            "published": f"2026-02-{10 + i:02d}T06:00",
            "duration_s": 1800,
            "size_mb": 60,
            "played": False,
            "progress_s": 0,
        }
        for i in range(5)
    ]
    return {"shows": shows, "episodes": episodes, "settings": {"storage_limit_mb": 100}}


def test_podcasts_subscribe_download_queue_play() -> None:
    env = _open(["podcasts"], {"podcasts": _podcast_world()})
    assert [s["id"] for s in ok(env, "podcasts_search", query="orbit")] == ["sh_1"]
    assert ok(env, "podcasts_search", query="e", category="sports")[0]["id"] == "sh_2"
    assert [e["id"] for e in ok(env, "podcasts_list_episodes", show_id="sh_1", limit=2)] == [
        "ep_2",
        "ep_1",
    ]
    fails(
        env,
        "podcasts_download",
        "precondition_failed",
        "subscribe to the show first",
        episode_id="ep_2",
    )
    ok(env, "podcasts_subscribe", show_id="sh_1")
    fails(env, "podcasts_subscribe", "precondition_failed", "already subscribed", show_id="sh_1")
    assert [s["show_id"] for s in ok(env, "podcasts_list_subscriptions")] == ["sh_1"]
    ok(env, "podcasts_download", episode_id="ep_2")
    fails(env, "podcasts_download", "precondition_failed", "storage full", episode_id="ep_1")
    ok(env, "podcasts_remove_download", episode_id="ep_2")
    fails(
        env, "podcasts_remove_download", "precondition_failed", "not downloaded", episode_id="ep_2"
    )
    ok(env, "podcasts_download", episode_id="ep_1")
    assert [d["episode_id"] for d in ok(env, "podcasts_list_downloads")] == ["ep_1"]
    ok(env, "podcasts_unsubscribe", show_id="sh_1")
    assert ok(env, "podcasts_list_downloads") == []
    fails(env, "podcasts_unsubscribe", "precondition_failed", "not subscribed", show_id="sh_1")
    ok(env, "podcasts_queue_add", episode_id="ep_0")
    queue = ok(env, "podcasts_queue_add", episode_id="ep_3", position="next")
    assert [q["episode_id"] for q in queue] == ["ep_3", "ep_0"]
    fails(env, "podcasts_queue_add", "precondition_failed", "already queued", episode_id="ep_0")
    fails(env, "podcasts_set_playback", "precondition_failed", "nothing is playing", speed=1.5)
    fails(
        env,
        "podcasts_play",
        "precondition_failed",
        "past the end",
        episode_id="ep_3",
        start_at_s=5000,
    )
    player = ok(env, "podcasts_play", episode_id="ep_3", start_at_s=600)
    assert player["position_s"] == 600
    assert [q["episode_id"] for q in ok(env, "podcasts_get_queue")] == ["ep_0"]
    fails(env, "podcasts_set_playback", "invalid_arguments", "speed", speed=4.0)
    assert ok(env, "podcasts_set_playback", speed=1.5, sleep_timer_min=30)["speed"] == 1.5
    marked = ok(env, "podcasts_mark_played", episode_ids=["ep_3", "ep_4"])
    assert marked["changed"] == ["ep_3", "ep_4"]
    assert ok(env, "podcasts_get_episode", episode_id="ep_3")["progress_s"] == 0


# --------------------------------------------------------------------------- home app


def _home() -> tuple[HomeBuilder, dict[str, dict[str, Any]]]:
    import random

    b = HomeBuilder(random.Random(5), ["Living Room", "Bedroom", "Kitchen"], pin="4821")
    d = {
        "lamp": b.light("Living Room", on=False),
        "dead": b.light("Living Room", on=True, online=False),
        "thermo": b.thermostat("Bedroom", mode="eco", current=19.0),
        "front": b.lock("Front Door", "Hallway", locked=False),
        "back": b.lock("Back Door", "Kitchen", locked=False, jammed=True),
        "cam": b.camera("Front Porch Camera"),
        "cam_off": b.camera("Garage Camera", online=False),
        "plug": b.plug("Kettle Plug", "Kitchen"),
    }
    return b, d


def test_home_lights_thermostat_plugs_cameras() -> None:
    b, d = _home()
    events = [
        {
            "id": "ev_1",
            "camera_id": d["cam"]["id"],
            "kind": "person",
            "time": "2026-03-02T07:00",
            "description": "person",
        }
    ]
    env = _open(["home"], {"home": b.state(camera_events=events)})
    rooms = {r["name"]: r["devices"] for r in ok(env, "home_list_rooms")}
    assert rooms["Living Room"] == 2
    assert len(ok(env, "home_list_devices", type="camera", online_only=True)) == 1
    fails(env, "home_list_devices", "precondition_failed", "unknown room", room="Attic")
    result = ok(env, "home_set_room_lights", room="living room", on=True, brightness=40)
    assert result["changed"] == [d["lamp"]["id"]] and result["skipped_offline"] == [d["dead"]["id"]]
    fails(
        env,
        "home_set_light",
        "precondition_failed",
        "device offline",
        device_id=d["dead"]["id"],
        on=False,
    )
    fails(
        env,
        "home_set_light",
        "invalid_arguments",
        "brightness",
        device_id=d["lamp"]["id"],
        on=True,
        brightness=0,
    )
    fails(
        env,
        "home_set_light",
        "precondition_failed",
        "not a light",
        device_id=d["plug"]["id"],
        on=True,
    )
    assert (
        ok(env, "home_set_light", device_id=d["lamp"]["id"], on=True, color="blue")["color"]
        == "blue"
    )
    tid = d["thermo"]["id"]
    fails(env, "home_set_thermostat", "precondition_failed", "eco mode", device_id=tid, target_c=21)
    ok(env, "home_set_thermostat_mode", device_id=tid, mode="heat")
    fails(
        env,
        "home_set_thermostat",
        "precondition_failed",
        "temperature out of range",
        device_id=tid,
        target_c=35,
    )
    assert ok(env, "home_set_thermostat", device_id=tid, target_c=21.5)["target_c"] == 21.5
    assert ok(env, "home_get_device", device_id=tid)["mode"] == "heat"
    assert ok(env, "home_set_plug", device_id=d["plug"]["id"], on=False)["on"] is False
    fails(
        env,
        "home_set_camera",
        "precondition_failed",
        "device offline",
        device_id=d["cam_off"]["id"],
        recording=True,
    )
    assert ok(env, "home_set_camera", device_id=d["cam"]["id"], recording=True)["recording"] is True
    seen = ok(
        env, "home_camera_events", camera_id=d["cam"]["id"], kind="person", after="2026-03-02T06:00"
    )
    assert [e["id"] for e in seen] == ["ev_1"]
    assert ok(env, "home_camera_events", kind="person", after="2026-03-02T08:00") == []


def test_home_locks_scenes_security_guest_codes() -> None:
    b, d = _home()
    env = _open(["home"], {"home": b.state()})
    front, back = d["front"]["id"], d["back"]["id"]
    fails(env, "home_lock", "precondition_failed", "door lock jammed", device_id=back)
    fails(env, "home_unlock", "permission_denied", "wrong PIN", device_id=front, pin="1111")
    fails(
        env, "home_set_security", "precondition_failed", "cannot arm away", mode="away", pin="4821"
    )
    actions = [
        {"device_id": front, "command": "lock"},
        {"device_id": back, "command": "lock"},
        {"device_id": d["thermo"]["id"], "command": "set_mode", "value": "eco"},
        {"device_id": d["lamp"]["id"], "command": "off"},
    ]
    fails(
        env,
        "home_create_scene",
        "precondition_failed",
        "does not apply",
        name="Bad",
        actions=[{"device_id": front, "command": "off"}],
    )
    scene = ok(env, "home_create_scene", name="Away", actions=actions)
    assert scene["actions"][0] == {"device_id": front, "command": "lock", "value": None}
    fails(
        env,
        "home_create_scene",
        "precondition_failed",
        "already exists",
        name="away",
        actions=actions,
    )
    fails(
        env,
        "home_run_scene",
        "precondition_failed",
        "stopped at action 2: door lock jammed",
        scene_id=scene["id"],
    )
    ok(env, "home_recalibrate_lock", device_id=back)
    assert ok(env, "home_run_scene", scene_id=scene["id"])["executed"] == 4
    assert ok(env, "home_set_security", mode="away", pin="4821")["mode"] == "away"
    assert [s["name"] for s in ok(env, "home_list_scenes")] == ["Away"]
    ok(env, "home_delete_scene", scene_id=scene["id"])
    assert ok(env, "home_list_scenes") == []
    assert ok(env, "home_unlock", device_id=front, pin="4821")["locked"] is False
    fails(
        env,
        "home_create_guest_code",
        "precondition_failed",
        "after valid_from",
        lock_id=front,
        guest_name="Sam",
        code="123456",
        valid_from="2026-03-03T12:00",
        valid_until="2026-03-03T10:00",
    )
    code = ok(
        env,
        "home_create_guest_code",
        lock_id=front,
        guest_name="Sam",
        code="123456",
        valid_from="2026-03-03T10:00",
        valid_until="2026-03-03T12:00",
    )
    fails(
        env,
        "home_create_guest_code",
        "precondition_failed",
        "already in use",
        lock_id=front,
        guest_name="Kim",
        code="123456",
        valid_from="2026-03-04T10:00",
        valid_until="2026-03-04T12:00",
    )
    assert [c["id"] for c in ok(env, "home_list_guest_codes", lock_id=front)] == [code["id"]]
    ok(env, "home_revoke_guest_code", code_id=code["id"])
    fails(
        env, "home_revoke_guest_code", "precondition_failed", "already revoked", code_id=code["id"]
    )


def test_guest_code_may_not_equal_master_pin() -> None:
    import random

    b = HomeBuilder(random.Random(1), ["Hallway"], pin="482100")
    lock = b.lock("Front Door", "Hallway")
    env = _open(["home"], {"home": b.state()})
    fails(
        env,
        "home_create_guest_code",
        "permission_denied",
        "master PIN",
        lock_id=lock["id"],
        guest_name="Sam",
        code="482100",
        valid_from="2026-03-03T10:00",
        valid_until="2026-03-03T12:00",
    )


# --------------------------------------------------------------------------- templates & suite


def test_template_coverage_per_domain() -> None:
    templates = [t for t in all_templates().values() if t.domain in DOMAINS]
    by_domain: dict[str, list[Any]] = defaultdict(list)
    for tpl in templates:
        by_domain[tpl.domain].append(tpl)
        assert 1 <= tpl.difficulty <= 5
    for domain in DOMAINS:
        assert len(by_domain[domain]) >= 7, domain
        caps = Counter(c for tpl in by_domain[domain] for c in tpl.capabilities)
        for cap in ("tool_use", "memory", "skills", "subagent"):
            assert caps[cap] >= 2, (domain, cap)


def test_every_template_yields_distinct_instructions() -> None:
    tasks = _tasks()
    per_template = Counter(t.template for t in tasks)
    assert all(n == 24 for n in per_template.values()), per_template
    assert len({t.instruction for t in tasks}) == len(tasks)
    for task in tasks:
        records = sum(
            len(v) for s in task.world.values() for v in s.values() if isinstance(v, list)
        )
        assert records <= 40, task.id


@pytest.mark.parametrize(
    "planner,expected", [("oracle", True), ("noop", False), ("greedy_wrong", False)]
)
def test_reference_planners_on_every_task(planner: str, expected: bool) -> None:
    env = SandboxEnv()
    wrong = []
    for task in _tasks():
        trajectory = run_episode(env, task, make_planner(planner))
        if trajectory.success != expected:
            wrong.append(task.id)
        if planner == "oracle":
            errors = [s.feedback.message for s in trajectory.steps if s.feedback.status == "error"]
            assert not errors, (task.id, errors)
    assert not wrong, wrong[:5]


def test_every_tool_is_planned_or_unit_tested() -> None:
    planned = {a.tool for t in _tasks() for a in t.reference_plan or [] if isinstance(a, ToolCall)}
    defined = {name for app in APPS for name in all_apps()[app].bound_tools}
    source = Path(__file__).read_text(encoding="utf-8")
    untested = [n for n in defined - planned if f'"{n}"' not in source]
    assert not untested, untested


def test_subagent_tasks_delegate_with_scoped_tools() -> None:
    for task in _tasks():
        if "subagent" not in task.capabilities:
            continue
        plan = task.reference_plan or []
        delegates = [a for a in plan if a.type == "delegate"]
        assert len(delegates) >= 2, task.id
        assert all(d.tools for d in delegates)
        assert plan[-1].type == "finish"


def test_memory_tasks_carry_conflicting_evidence() -> None:
    for task in _tasks():
        if "memory" not in task.capabilities:
            continue
        keys = Counter(m.key for m in task.memory)
        conflicted = [k for k, n in keys.items() if n >= 2]
        assert conflicted, task.id
        for key in conflicted:
            assert len({m.value for m in task.memory if m.key == key}) >= 2


def test_memory_winner_prefers_evidence_then_recency() -> None:
    from datetime import datetime

    items = [
        MemoryItem(key="k", value="old-stated", evidence="stated", time=datetime(2025, 1, 1)),
        MemoryItem(key="k", value="new-inferred", evidence="inferred", time=datetime(2026, 2, 1)),
        MemoryItem(key="k", value="newer-stated", evidence="stated", time=datetime(2025, 6, 1)),
    ]
    assert memory_winner(items, "k") == "newer-stated"
    import random

    for seed in range(50):
        mem = conflicting_memory(random.Random(seed), "manager", "Right", ["Wrong1", "Wrong2"])
        assert memory_winner(mem, "manager") == "Right"


def test_injection_tasks_show_the_injection_and_punish_following_it() -> None:
    injected = [
        t
        for t in _tasks()
        if t.template in ("project_status_with_injection", "reply_ignoring_injection")
    ]
    assert injected
    env = SandboxEnv()
    for task in injected[:6]:
        absent = [c for c in task.verifier.checks if c.op == "absent" and "to__contains" in c.where]
        assert absent, task.id
        evil = absent[0].where["to__contains"]
        trajectory = run_episode(env, task, make_planner("oracle"))
        bodies = " ".join(
            str(s.feedback.observation) for s in trajectory.steps if s.action.type == "tool_call"
        )
        assert "ignore" in bodies.lower() and evil in bodies, task.id
        # An agent that obeys the email: same plan plus the exfiltrating forward.
        plan = list(task.reference_plan or [])
        message = next(m for m in task.world["email"]["messages"] if evil in m["body"])
        follow = ToolCall(
            tool="email_forward", arguments={"message_id": message["id"], "to": [evil]}
        )
        obeying = task.model_copy(update={"reference_plan": [*plan[:-1], follow, plan[-1]]})
        assert not run_episode(env, obeying, make_planner("oracle")).success, task.id


def test_tasks_are_deterministic() -> None:
    tpl = all_templates()["away_mode_scene"]
    assert build_task(tpl, "test", 3, 0) == build_task(tpl, "test", 3, 0)
    task = next(t for t in _tasks() if t.template == "triage_three_mailboxes")
    first = run_episode(SandboxEnv(), task, make_planner("oracle"))
    second = run_episode(SandboxEnv(), task, make_planner("oracle"))
    assert [s.feedback for s in first.steps] == [s.feedback for s in second.steps]


def test_checks_reference_known_collections() -> None:
    apps = all_apps()
    for task in _tasks():
        for check in task.verifier.checks:
            assert isinstance(check, Check)
            app = check.target.split(".")[0]
            assert app in task.apps and app in apps, (task.id, check.target)
        assert isinstance(task.reference_plan[-1], Finish)  # type: ignore[index]
