"""Music & media tasks: play on speakers, build playlists (region rights, sub-agents per
artist), favorites and workout playlists from memory, podcast downloads, resume and queues."""

from __future__ import annotations

import random
from typing import Any

from qpa.contract import Check, Delegate, Finish, ToolCall
from qpa.envs.sandbox.apps.music import MusicApp
from qpa.envs.sandbox.apps.podcasts import PodcastsApp
from qpa.envs.sandbox.authoring import PlanBuilder, conflicting_memory, past_time
from qpa.envs.sandbox.suite import TaskGen, template

ARTISTS = [
    "The Velvet Owls",
    "Mara Quinn",
    "Neon Harbor",
    "Solenne",
    "Kofi and the Tides",
    "Juniper Lane",
    "Static Bloom",
    "Ravi Kapoor Trio",
    "Luna Verde",
    "Echo Parade",
    "Desert Radio",
    "Ivy Calder",
    "Northern Array",
    "Milo Grant",
    "Golden Hour Club",
    "Sierra Moss",
    "Blue Lantern",
    "Theo Marsh",
    "Glass Atlas",
    "Paper Comets",
]
TITLE_A = [
    "Midnight",
    "Golden",
    "Electric",
    "Quiet",
    "Wild",
    "Silver",
    "Paper",
    "Broken",
    "Neon",
    "Summer",
    "Hollow",
    "Crimson",
    "Velvet",
    "Distant",
]
TITLE_B = [
    "Highway",
    "Letters",
    "Garden",
    "Signals",
    "Tides",
    "Satellites",
    "Lanterns",
    "Rivers",
    "Heartbeat",
    "Skyline",
    "Echoes",
    "Horizon",
    "Parade",
    "Static",
]
ALBUMS = [
    "Second Nature",
    "Open Water",
    "Low Tide",
    "First Light",
    "Slow Burn",
    "Safe Harbour",
    "Long Way Home",
    "New Moon",
    "Glass House",
    "Open Road",
    "Blue Hour",
    "Northern Lights",
]
GENRES = ["pop", "rock", "jazz", "hip-hop", "electronic", "folk", "r&b"]
REGIONS = ["US", "CA", "GB", "DE", "FR", "JP"]
SPEAKERS = [
    ("Kitchen Speaker", "speaker"),
    ("Living Room TV", "tv"),
    ("Bedroom Speaker", "speaker"),
    ("Office Speaker", "speaker"),
    ("Patio Speaker", "speaker"),
    ("Bathroom Speaker", "speaker"),
    ("Garage Speaker", "speaker"),
]
PLAYLISTS = [
    "Road Trip",
    "Sunday Morning",
    "Focus Flow",
    "Late Night Drive",
    "Kitchen Dance Party",
    "Rainy Day",
    "Gym Energy",
    "Dinner Party",
    "Study Session",
    "Beach Day",
    "Morning Run",
    "Chill Evenings",
    "Throwbacks",
    "Deep Work",
    "Cardio Mix",
    "Lazy Sunday",
]
SHOWS = [
    ("The Daily Signal", "Signal Media", "news"),
    ("Byte Sized", "Kilobyte Audio", "technology"),
    ("History Unboxed", "Atlas Audio", "history"),
    ("Laugh Track", "Giggle Network", "comedy"),
    ("Deep Field", "Orbit Studios", "science"),
    ("Market Hours", "Ledger FM", "business"),
    ("Extra Time", "Pitchside", "sports"),
    ("Cold Case Files", "Noir Audio", "true crime"),
    ("Future Stack", "Kilobyte Audio", "technology"),
    ("Small Wonders", "Orbit Studios", "science"),
    ("The Long Game", "Pitchside", "sports"),
    ("Founders Diary", "Ledger FM", "business"),
    ("Past Tense", "Atlas Audio", "history"),
    ("Quiet Mysteries", "Noir Audio", "true crime"),
    ("Morning Brief", "Signal Media", "news"),
    ("Stand-Up Hour", "Giggle Network", "comedy"),
]
EP_TOPICS = [
    "The Chip Shortage",
    "Lost Cities",
    "How Bridges Fail",
    "The Coffee Economy",
    "Inside a Newsroom",
    "The Last Glacier",
    "Startup Myths",
    "The Great Heist",
    "Deep Sea Life",
    "Stadium Politics",
    "The Printing Press",
    "Quantum Basics",
    "Comedy Clubs",
    "Cold Trails",
    "Tiny Houses",
    "The Rail Boom",
    "Space Junk",
    "Family Businesses",
    "Marathon Science",
    "Forgotten Empires",
    "Ocean Shipping",
    "Night Markets",
    "The Vaccine Race",
    "Sleep Science",
]


# --------------------------------------------------------------------------- music world


def build_catalog(
    rng: random.Random,
    artists: list[str],
    region: str,
    *,
    per_artist: int = 5,
    unavailable: dict[str, list[int]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Tracks for `artists`; `unavailable[artist]` lists popularity ranks (0 = top) blocked in
    `region`. Returns the catalog and each artist's tracks, most popular first."""
    titles = rng.sample([f"{a} {b}" for a in TITLE_A for b in TITLE_B], per_artist * len(artists))
    pops = rng.sample(range(10, 100), per_artist * len(artists))
    catalog: list[dict[str, Any]] = []
    by_artist: dict[str, list[dict[str, Any]]] = {}
    n = 0
    for artist in artists:
        genre = rng.choice(GENRES)
        album = rng.choice(ALBUMS)
        mine = sorted(pops[n : n + per_artist], reverse=True)
        rows = []
        for rank, pop in enumerate(mine):
            blocked = rank in (unavailable or {}).get(artist, [])
            others = [r for r in REGIONS if r != region]
            regions = rng.sample(others, 3) if blocked else sorted({region, *rng.sample(others, 3)})
            rows.append(
                {
                    "id": f"t_{200 + n + rank}",
                    "title": titles[n + rank],
                    "artist": artist,
                    "album": album,
                    "genre": genre,
                    "duration_s": rng.randint(150, 330),
                    "year": rng.randint(1995, 2025),
                    "explicit": False,
                    "regions": regions,
                    "popularity": pop,
                }
            )
        n += per_artist
        by_artist[artist] = rows
        catalog.extend(rows)
    rng.shuffle(catalog)
    return catalog, by_artist


def _searchable(track: dict[str, Any]) -> str:
    """The text music_search matches query words against."""
    return f"{track['title']} {track['artist']} {track['album']}".lower()


def devices(rng: random.Random, n: int = 4, standby: int = 1) -> list[dict[str, Any]]:
    rows = [
        {"id": "dev_phone", "name": "This phone", "kind": "phone", "status": "online", "volume": 50}
    ]
    for i, (name, kind) in enumerate(rng.sample(SPEAKERS, n)):
        status = "standby" if i < standby else rng.choice(["online", "online", "offline"])
        rows.append(
            {
                "id": f"dev_{300 + i}",
                "name": name,
                "kind": kind,
                "status": status,
                "volume": rng.choice([20, 30, 40, 60]),
            }
        )
    return rows


def playlist(pid: str, name: str, track_ids: list[str], max_tracks: int = 100) -> dict[str, Any]:
    return {
        "id": pid,
        "name": name,
        "description": "",
        "public": False,
        "collaborative": False,
        "max_tracks": max_tracks,
        "track_ids": list(track_ids),
        "track_count": len(track_ids),
        "created": "2025-11-02T10:00",
    }


def music_state(
    rng: random.Random,
    catalog: list[dict[str, Any]],
    region: str = "US",
    *,
    playlists: list[dict[str, Any]] | None = None,
    device_rows: list[dict[str, Any]] | None = None,
    history: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        **MusicApp.default_state(),
        "account": {
            "user": "Alex Morgan",
            "region": region,
            "plan": "premium",
            "explicit_filter": False,
        },
        "catalog": catalog,
        "playlists": playlists or [],
        "devices": device_rows or devices(rng),
        "history": history or [],
    }


# --------------------------------------------------------------------------- podcast world


def podcast_state(
    rng: random.Random, shows: list[tuple[str, str, str]], *, per_show: int = 4
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Shows with episodes (newest first per show in the returned mapping)."""
    show_rows, episodes, by_show = [], [], {}
    topics = rng.sample(EP_TOPICS, min(len(EP_TOPICS), per_show * len(shows)))
    k = 0
    for i, (title, publisher, category) in enumerate(shows):
        sid = f"sh_{400 + i}"
        show_rows.append(
            {
                "id": sid,
                "title": title,
                "publisher": publisher,
                "category": category,
                "description": f"{title}: a {category} podcast by {publisher}.",
            }
        )
        number = rng.randint(40, 300)
        rows = []
        for j in range(per_show):
            rows.append(
                {
                    "id": f"ep_{500 + k}",
                    "show_id": sid,
                    "title": f"Ep. {number - j}: {topics[k % len(topics)]}",
                    "published": f"2026-02-{27 - 3 * j:02d}T{6 + i % 10:02d}:00",
                    "duration_s": rng.randint(25, 75) * 60,
                    "size_mb": rng.randint(30, 90),
                    "played": False,
                    "progress_s": 0,
                }
            )
            k += 1
        by_show[sid] = rows
        episodes.extend(rows)
    rng.shuffle(episodes)
    state = {**PodcastsApp.default_state(), "shows": show_rows, "episodes": episodes}
    return state, by_show


# --------------------------------------------------------------------------- templates


@template(domain="media", capabilities=["skills", "tool_use"], apps=["music"], difficulty=3)
def play_top_song_on_speaker(g: TaskGen) -> Any:
    region = g.rng.choice(REGIONS)
    artists = g.fake.pick(ARTISTS, 4)
    artist = artists[0]
    catalog, by_artist = build_catalog(g.rng, artists, region, unavailable={artists[1]: [0]})
    rows = devices(g.rng, 4, standby=1)
    speaker = rows[1]
    top = by_artist[artist][0]
    phrase = g.rng.choice(["most popular song", "biggest hit", "top track"])
    return g.task(
        instruction=f"Play {artist}'s {phrase} on the {speaker['name']}.",
        world={"music": music_state(g.rng, catalog, region, device_rows=rows)},
        checks=[
            Check(
                name="top track playing",
                op="equals",
                target="music.player.track_id",
                expect=top["id"],
            ),
            Check(
                name="on the speaker",
                op="equals",
                target="music.player.device_id",
                expect=speaker["id"],
            ),
            Check(name="playing", op="equals", target="music.player.state", expect="playing"),
        ],
        plan=[
            ToolCall(tool="music_list_devices"),
            ToolCall(tool="music_wake_device", arguments={"device_id": speaker["id"]}),
            ToolCall(tool="music_artist_top_tracks", arguments={"artist": artist, "limit": 1}),
            ToolCall(
                tool="music_play", arguments={"context_id": "${2.0.id}", "device_id": speaker["id"]}
            ),
            Finish(),
        ],
    )


@template(domain="media", capabilities=["subagent", "tool_use"], apps=["music"], difficulty=4)
def playlist_from_three_artists(g: TaskGen) -> Any:
    region = g.rng.choice(REGIONS)
    artists = g.fake.pick(ARTISTS, 5)
    chosen = artists[:3]
    blocked = {a: [g.rng.choice([2, 3, 4])] for a in chosen}
    catalog, by_artist = build_catalog(g.rng, artists, region, unavailable=blocked)
    name = (
        f"{g.rng.choice(PLAYLISTS)} {g.rng.choice(['Mix', 'Vol. 2', 'Picks', 'Session', '2026'])}"
    )
    existing = [playlist("pl_100", g.rng.choice(PLAYLISTS) + " Classics", [catalog[0]["id"]])]
    plan = PlanBuilder()
    created = plan.call("music_create_playlist", name=name)
    wanted: list[str] = []
    for artist in chosen:
        plan.add(
            Delegate(
                goal=f"Add the two most popular songs by {artist} to playlist '{name}'.",
                tools=["music_artist_top_tracks", "music_add_tracks"],
                agent=f"curator_{artist.split()[-1].lower()}",
            )
        )
        top = plan.call("music_artist_top_tracks", artist=artist, limit=2)
        plan.call(
            "music_add_tracks",
            playlist_id=f"${{{created}.id}}",
            track_ids=[f"${{{top}.0.id}}", f"${{{top}.1.id}}"],
        )
        plan.add(Finish(answer=f"added 2 songs by {artist}"))
        wanted.extend(t["id"] for t in by_artist[artist][:2])
    plan.add(Finish(answer=f"Created '{name}' with 6 songs."))
    return g.task(
        instruction=(
            f'Create a playlist called "{name}" with the two most popular songs by each of '
            f"{chosen[0]}, {chosen[1]} and {chosen[2]}."
        ),
        world={"music": music_state(g.rng, catalog, region, playlists=existing)},
        checks=[
            Check(
                name="playlist with six songs",
                target="music.playlists",
                where={"name": name, "track_count": 6},
            ),
            *(
                Check(
                    name=f"{tid} in playlist",
                    target="music.playlists",
                    where={"name": name, "track_ids__contains": tid},
                )
                for tid in wanted
            ),
        ],
        plan=plan.steps,
    )


@template(domain="media", capabilities=["skills"], apps=["music"], difficulty=3)
def region_safe_playlist_additions(g: TaskGen) -> Any:
    region = g.rng.choice(REGIONS)
    artists = g.fake.pick(ARTISTS, 4)
    artist = artists[0]
    blocked_ranks = sorted(g.rng.sample([0, 1, 2, 3], g.rng.randint(1, 2)))
    catalog, by_artist = build_catalog(
        g.rng, artists, region, per_artist=6, unavailable={artist: blocked_ranks}
    )
    ranked = by_artist[artist]
    available = [i for i in range(len(ranked)) if i not in blocked_ranks][:3]
    wanted = [ranked[i]["id"] for i in available]
    names = g.fake.pick(PLAYLISTS, 3)
    others = [t["id"] for t in catalog if t["artist"] != artist]
    lists = [
        playlist(f"pl_{100 + i}", n, g.rng.sample(others, g.rng.randint(2, 6)))
        for i, n in enumerate(names)
    ]
    target = lists[0]
    before = len(target["track_ids"])
    return g.task(
        instruction=(
            f"Add the three most popular {artist} songs that I can actually play here to "
            f'my "{target["name"]}" playlist.'
        ),
        world={"music": music_state(g.rng, catalog, region, playlists=lists)},
        checks=[
            *(
                Check(
                    name=f"{tid} added",
                    target="music.playlists",
                    where={"id": target["id"], "track_ids__contains": tid},
                )
                for tid in wanted
            ),
            Check(
                name="exactly three songs added",
                target="music.playlists",
                where={"id": target["id"], "track_count": before + 3},
            ),
        ],
        plan=[
            ToolCall(tool="music_get_account"),
            ToolCall(tool="music_list_playlists"),
            ToolCall(tool="music_artist_top_tracks", arguments={"artist": artist, "limit": 6}),
            ToolCall(
                tool="music_add_tracks",
                arguments={
                    "playlist_id": target["id"],
                    "track_ids": [f"${{2.{i}.id}}" for i in available],
                },
            ),
            Finish(),
        ],
    )


@template(domain="media", capabilities=["memory", "tool_use"], apps=["music"], difficulty=2)
def favorite_playlist_on_speaker(g: TaskGen) -> Any:
    region = g.rng.choice(REGIONS)
    artists = g.fake.pick(ARTISTS, 3)
    catalog, _ = build_catalog(g.rng, artists, region, per_artist=4)
    names = g.fake.pick(PLAYLISTS, 4)
    ids = [t["id"] for t in catalog]
    lists = [playlist(f"pl_{100 + i}", n, g.rng.sample(ids, 4)) for i, n in enumerate(names)]
    right, wrong = lists[0], lists[1:3]
    memory = conflicting_memory(
        g.rng, "favorite_playlist", right["name"], [w["name"] for w in wrong]
    )
    rows = devices(g.rng, 4, standby=0)
    for row in rows[1:]:
        row["status"] = "online"
    device = g.rng.choice(rows[1:])
    volume = g.rng.choice(range(15, 90, 5))
    phrase = g.rng.choice(
        ["Put my favorite playlist on shuffle on", "Shuffle my favorite playlist on"]
    )
    return g.task(
        instruction=f"{phrase} the {device['name']} and set the volume to {volume}%.",
        world={"music": music_state(g.rng, catalog, region, playlists=lists, device_rows=rows)},
        memory=memory,
        checks=[
            Check(
                name="favorite playlist playing",
                op="equals",
                target="music.player.context_id",
                expect=right["id"],
            ),
            Check(name="shuffle on", op="equals", target="music.player.shuffle", expect=True),
            Check(
                name="on the device",
                op="equals",
                target="music.player.device_id",
                expect=device["id"],
            ),
            Check(
                name="volume set",
                target="music.devices",
                where={"id": device["id"], "volume": volume},
            ),
        ],
        plan=[
            ToolCall(tool="music_list_playlists"),
            ToolCall(tool="music_list_devices"),
            ToolCall(
                tool="music_play",
                arguments={"context_id": right["id"], "device_id": device["id"], "shuffle": True},
            ),
            ToolCall(
                tool="music_set_volume", arguments={"level": volume, "device_id": device["id"]}
            ),
            Finish(),
        ],
    )


@template(domain="media", capabilities=["memory", "tool_use"], apps=["music"], difficulty=3)
def add_song_to_workout_playlist(g: TaskGen) -> Any:
    region = g.rng.choice(REGIONS)
    artists = g.fake.pick(ARTISTS, 4)
    catalog, by_artist = build_catalog(g.rng, artists, region, per_artist=4)
    song = g.rng.choice(by_artist[artists[0]])
    names = g.fake.pick(
        [
            "Gym Energy",
            "Cardio Mix",
            "Morning Run",
            "Leg Day",
            "Spin Class",
            "HIIT Hits",
            "Power Hour",
            "Trail Run",
        ],
        3,
    )
    others = [t["id"] for t in catalog if t["id"] != song["id"]]
    lists = [playlist(f"pl_{100 + i}", n, g.rng.sample(others, 5)) for i, n in enumerate(names)]
    lists.append(
        playlist("pl_110", g.rng.choice(["Rainy Day", "Lazy Sunday", "Focus Flow"]), others[:3])
    )
    right, wrong = lists[0], lists[1:3]
    memory = conflicting_memory(
        g.rng, "workout_playlist", right["name"], [w["name"] for w in wrong]
    )
    query = f"{song['title']} {song['artist']}"
    hits = [t for t in catalog if all(w in _searchable(t) for w in query.lower().split())]
    hit = sorted(hits, key=lambda t: -t["popularity"]).index(song)
    return g.task(
        instruction=f'Add "{song["title"]}" by {song["artist"]} to my workout playlist.',
        world={"music": music_state(g.rng, catalog, region, playlists=lists)},
        memory=memory,
        checks=[
            Check(
                name="added to the workout playlist",
                target="music.playlists",
                where={"id": right["id"], "track_ids__contains": song["id"]},
            ),
            Check(
                name="not added to other playlists",
                target="music.playlists",
                op="absent",
                where={"id__ne": right["id"], "track_ids__contains": song["id"]},
            ),
        ],
        plan=[
            ToolCall(tool="music_search", arguments={"query": query}),
            ToolCall(tool="music_list_playlists"),
            ToolCall(
                tool="music_add_tracks",
                arguments={"playlist_id": right["id"], "track_ids": [f"${{0.{hit}.id}}"]},
            ),
            Finish(),
        ],
    )


@template(domain="media", capabilities=["tool_use"], apps=["music"], difficulty=2)
def like_song_from_history(g: TaskGen) -> Any:
    region = g.rng.choice(REGIONS)
    artists = g.fake.pick(ARTISTS, 3)
    catalog, _ = build_catalog(g.rng, artists, region, per_artist=4)
    played = g.rng.sample(catalog, 6)
    moments = sorted({past_time(g.rng, max_days=2) for _ in range(12)})[-6:]
    history = [{"track_id": t["id"], "played_at": m} for t, m in zip(played, moments, strict=False)]
    ordered = sorted(history, key=lambda h: h["played_at"], reverse=True)
    k = g.rng.randrange(len(ordered))
    pick = ordered[k]
    track = next(t for t in catalog if t["id"] == pick["track_id"])
    if region not in track["regions"]:
        track["regions"] = sorted({region, *track["regions"]})
    names = g.fake.pick(PLAYLISTS, 3)
    lists = [playlist(f"pl_{100 + i}", n, []) for i, n in enumerate(names)]
    target = lists[0]
    moment = pick["played_at"]
    days = {"2026-03-02": "today", "2026-03-01": "yesterday"}
    day = days.get(moment[:10], "on " + moment[:10])
    return g.task(
        instruction=(
            f"Like the song I was listening to {day} at {moment[11:]} and add it to my "
            f'"{target["name"]}" playlist.'
        ),
        world={"music": music_state(g.rng, catalog, region, playlists=lists, history=history)},
        checks=[
            Check(name="song liked", target="music.liked", where={"track_id": track["id"]}),
            Check(name="only one like", target="music.liked", op="count", expect=1),
            Check(
                name="added to the playlist",
                target="music.playlists",
                where={"id": target["id"], "track_ids": [track["id"]]},
            ),
        ],
        plan=[
            ToolCall(tool="music_recently_played", arguments={"limit": 10}),
            ToolCall(tool="music_like_track", arguments={"track_id": f"${{0.{k}.track_id}}"}),
            ToolCall(
                tool="music_add_tracks",
                arguments={"playlist_id": target["id"], "track_ids": [f"${{0.{k}.track_id}}"]},
            ),
            Finish(),
        ],
    )


@template(domain="media", capabilities=["skills", "tool_use"], apps=["podcasts"], difficulty=3)
def download_for_offline(g: TaskGen) -> Any:
    shows = g.fake.pick(SHOWS, 5)
    state, by_show = podcast_state(g.rng, shows)
    show = shows[0]
    sid = state["shows"][0]["id"]
    subscribed = state["shows"][1]["id"]
    state["subscriptions"] = [
        {"show_id": subscribed, "title": shows[1][0], "since": "2025-10-01T08:00"}
    ]
    n = g.rng.choice([1, 2])
    newest = by_show[sid][:n]
    what = "the newest episode" if n == 1 else "the two newest episodes"
    why = g.rng.choice(
        [
            "for my flight",
            "so I can listen on the subway",
            "before my road trip",
            "for the gym later",
            "for my commute tomorrow",
        ]
    )
    plan = PlanBuilder()
    search = plan.call("podcasts_search", query=show[0])
    listed = plan.call("podcasts_list_episodes", show_id=f"${{{search}.0.id}}", limit=n)
    plan.call("podcasts_subscribe", show_id=f"${{{search}.0.id}}")
    for i in range(n):
        plan.call("podcasts_download", episode_id=f"${{{listed}.{i}.id}}")
    plan.add(Finish())
    return g.task(
        instruction=f"Download {what} of {show[0]} {why}.",
        world={"podcasts": state},
        checks=[
            *(
                Check(
                    name=f"{e['id']} downloaded",
                    target="podcasts.downloads",
                    where={"episode_id": e["id"]},
                )
                for e in newest
            ),
            Check(name="only those downloaded", target="podcasts.downloads", op="count", expect=n),
            Check(
                name="subscribed to the show",
                target="podcasts.subscriptions",
                where={"show_id": sid},
            ),
        ],
        plan=plan.steps,
    )


@template(domain="media", capabilities=["memory", "skills"], apps=["podcasts"], difficulty=3)
def resume_episode_at_usual_speed(g: TaskGen) -> Any:
    shows = g.fake.pick(SHOWS, 4)
    state, by_show = podcast_state(g.rng, shows)
    sid = state["shows"][0]["id"]
    eps = by_show[sid]
    k = g.rng.randint(1, 3)
    current = eps[k]
    current["progress_s"] = g.rng.randint(5, current["duration_s"] // 60 - 5) * 60
    for e in eps[k + 1 :]:
        e["played"] = True
    other = by_show[state["shows"][1]["id"]][0]
    other["progress_s"] = 300
    speeds = g.rng.sample(["1.25", "1.5", "1.75", "2.0", "0.9"], 3)
    memory = conflicting_memory(
        g.rng, "podcast_speed", speeds[0] + "x", [s + "x" for s in speeds[1:]]
    )
    timer = g.rng.choice([10, 15, 20, 30, 45, 60])
    verb = g.rng.choice(["Continue", "Resume", "Pick up"])
    return g.task(
        instruction=(
            f"{verb} the {shows[0][0]} episode I was in the middle of, at my usual speed, "
            f"with a {timer}-minute sleep timer."
        ),
        world={"podcasts": state},
        memory=memory,
        checks=[
            Check(
                name="that episode",
                op="equals",
                target="podcasts.player.episode_id",
                expect=current["id"],
            ),
            Check(
                name="resumed, not restarted",
                op="equals",
                target="podcasts.player.position_s",
                expect=current["progress_s"],
            ),
            Check(
                name="usual speed",
                op="equals",
                target="podcasts.player.speed",
                expect=float(speeds[0]),
            ),
            Check(
                name="sleep timer",
                op="equals",
                target="podcasts.player.sleep_timer_min",
                expect=timer,
            ),
        ],
        plan=[
            ToolCall(tool="podcasts_search", arguments={"query": shows[0][0]}),
            ToolCall(tool="podcasts_list_episodes", arguments={"show_id": "${0.0.id}"}),
            ToolCall(tool="podcasts_get_episode", arguments={"episode_id": f"${{1.{k}.id}}"}),
            ToolCall(
                tool="podcasts_play",
                arguments={"episode_id": "${2.id}", "start_at_s": "${2.progress_s}"},
            ),
            ToolCall(
                tool="podcasts_set_playback",
                arguments={"speed": float(speeds[0]), "sleep_timer_min": timer},
            ),
            Finish(),
        ],
    )


@template(domain="media", capabilities=["subagent", "tool_use"], apps=["podcasts"], difficulty=4)
def queue_newest_from_three_shows(g: TaskGen) -> Any:
    shows = g.fake.pick(SHOWS, 5)
    state, by_show = podcast_state(g.rng, shows)
    chosen = shows[:3]
    picks: list[dict[str, Any]] = []
    plan = PlanBuilder()
    first_list = -1
    for i, show in enumerate(chosen):
        eps = by_show[state["shows"][i]["id"]]
        skip = g.rng.choice([0, 0, 1, 2])
        for e in eps[:skip]:
            e["played"] = True
        picks.append(eps[skip])
        plan.add(
            Delegate(
                goal=f"Queue (last) the newest unplayed episode of {show[0]}.",
                tools=["podcasts_search", "podcasts_list_episodes", "podcasts_queue_add"],
                agent=f"queue_{i + 1}",
            )
        )
        found = plan.call("podcasts_search", query=show[0])
        listed = plan.call(
            "podcasts_list_episodes", show_id=f"${{{found}.0.id}}", unplayed_only=True, limit=1
        )
        if i == 0:
            first_list = listed
        plan.call("podcasts_queue_add", episode_id=f"${{{listed}.0.id}}")
        plan.add(Finish(answer=f"queued {eps[skip]['title']}"))
    plan.call("podcasts_play", episode_id=f"${{{first_list}.0.id}}")
    plan.add(Finish())
    return g.task(
        instruction=(
            f"Queue the newest unplayed episode of {chosen[0][0]}, {chosen[1][0]} and "
            f"{chosen[2][0]}, in that order, then start playing the {chosen[0][0]} one."
        ),
        world={"podcasts": state},
        checks=[
            Check(
                name="first show's episode playing",
                op="equals",
                target="podcasts.player.episode_id",
                expect=picks[0]["id"],
            ),
            Check(
                name="second show's episode up next",
                op="equals",
                target="podcasts.queue.0.episode_id",
                expect=picks[1]["id"],
            ),
            Check(
                name="third show's episode after it",
                op="equals",
                target="podcasts.queue.1.episode_id",
                expect=picks[2]["id"],
            ),
            Check(name="nothing else queued", target="podcasts.queue", op="count", expect=2),
        ],
        plan=plan.steps,
    )


@template(domain="media", capabilities=["tool_use"], apps=["podcasts"], difficulty=3)
def clean_up_podcast_downloads(g: TaskGen) -> Any:
    shows = g.fake.pick(SHOWS, 4)
    state, by_show = podcast_state(g.rng, shows)
    s0, s1, s2 = (state["shows"][i]["id"] for i in range(3))
    eps = by_show[s0]
    k = g.rng.randint(1, 3)
    for e in eps[k:]:
        e["played"] = True
    state["subscriptions"] = [
        {"show_id": s, "title": shows[i][0], "since": "2025-12-01T08:00"}
        for i, s in enumerate([s0, s1, s2])
    ]
    keep = [by_show[s2][0]]
    downloads = [*eps, by_show[s1][0], *keep]
    state["downloads"] = [
        {
            "episode_id": e["id"],
            "show_id": e["show_id"],
            "size_mb": e["size_mb"],
            "time": "2026-02-27T20:00",
        }
        for e in downloads
    ]
    plan = PlanBuilder()
    plan.call("podcasts_list_downloads")
    listed = plan.call("podcasts_list_episodes", show_id=s0)
    for i in range(k, len(eps)):
        plan.call("podcasts_remove_download", episode_id=f"${{{listed}.{i}.id}}")
    plan.call("podcasts_unsubscribe", show_id=s1)
    plan.add(Finish())
    finished = g.rng.choice(["already finished", "already played", "listened to"])
    return g.task(
        instruction=(
            f"Delete the {shows[0][0]} episodes I've {finished} from my downloads, and "
            f"unsubscribe from {shows[1][0]}."
        ),
        world={"podcasts": state},
        checks=[
            Check(
                name="played episodes removed",
                target="podcasts.downloads",
                op="absent",
                where={"episode_id__in": [e["id"] for e in eps[k:]]},
            ),
            Check(
                name="unplayed and other downloads kept",
                target="podcasts.downloads",
                op="count",
                expect=k + len(keep),
            ),
            Check(
                name="unsubscribed",
                target="podcasts.subscriptions",
                op="absent",
                where={"show_id": s1},
            ),
            Check(
                name="still subscribed to the first show",
                target="podcasts.subscriptions",
                where={"show_id": s0},
            ),
        ],
        plan=plan.steps,
    )
