"""Music: a streaming catalog with region rights, playlists, likes, speakers and playback."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.cow import FrozenList
from qpa.envs.sandbox.engine import App, Limit, Offset, fail, paginate, tool, updates


def _track_text(t: dict[str, Any]) -> str:
    """What `music_search` matches its words in: title, artist and album, lowered."""
    return f"{t['title']} {t['artist']} {t['album']}".lower()


def _by_artist(catalog: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The catalog's positions per lowered artist name, most popular first (the stable sort
    `music_artist_top_tracks` does, so equal popularity keeps catalog order): a committed
    list's view."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(catalog):
        out.setdefault(t["artist"].lower(), []).append(i)
    return {
        name: sorted(found, key=lambda i: -catalog[i]["popularity"]) for name, found in out.items()
    }


Genre = Literal["pop", "rock", "jazz", "hip-hop", "electronic", "classical", "folk", "r&b"]
DeviceKind = Literal["phone", "speaker", "tv", "car"]
DeviceStatus = Literal["online", "standby", "offline"]
PlayerState = Literal["playing", "paused", "stopped"]
TrackIds = Annotated[list[str], Field(min_length=1, max_length=50)]


class Track(TypedDict):
    id: str
    title: str
    artist: str
    album: str
    genre: Genre
    duration_s: int
    year: int
    explicit: bool
    regions: list[str]
    popularity: int


class MusicAccount(TypedDict):
    user: str
    region: str
    plan: Literal["free", "premium", "family"]
    explicit_filter: bool


class PlaylistSummary(TypedDict):
    id: str
    name: str
    description: str
    track_count: int
    max_tracks: int
    public: bool
    collaborative: bool


class Playlist(PlaylistSummary):
    track_ids: list[str]
    tracks: list[Track]


class AddResult(TypedDict):
    playlist_id: str
    added: list[str]
    skipped_duplicates: list[str]
    track_count: int


class Device(TypedDict):
    id: str
    name: str
    kind: DeviceKind
    status: DeviceStatus
    volume: int


class Player(TypedDict):
    state: PlayerState
    context_id: str | None
    track_id: str | None
    device_id: str | None
    shuffle: bool


class NowPlaying(Player):
    track: Track | None


class Liked(TypedDict):
    track_id: str
    time: str


class Played(TypedDict):
    track_id: str
    title: str
    artist: str
    played_at: str


class Queued(TypedDict):
    track_id: str
    added: str
    position: int


class MusicApp(App):
    name = "music"
    title = "Music"
    description = (
        "Music streaming: search the catalog, artists' top tracks, playlists, liked songs, "
        "queue, and playback on the phone or connected speakers."
    )
    skills = {
        "region_availability": (
            "The catalog is global but rights are regional: a track plays (and can be added to "
            "playlists or the queue) only if its `regions` list contains the account region from "
            "music_get_account. Search and top-track results include unavailable tracks; skip "
            "them yourself. One unavailable track makes music_add_tracks reject the whole batch."
        ),
        "play_on_speaker": (
            "To play on a speaker or TV: music_list_devices, then if the device status is "
            "'standby' call music_wake_device first; only then music_play with its device_id. "
            "A device whose status is 'offline' cannot be reached: tell the user instead."
        ),
        "playlist_capacity": (
            "Each playlist holds at most max_tracks tracks (music_list_playlists). If a batch "
            "does not fit, create a continuation playlist named '<name> 2' and add the rest there."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "account": {"user": "", "region": "US", "plan": "premium", "explicit_filter": False},
            "catalog": [],
            "playlists": [],
            "liked": [],
            "devices": [
                {
                    "id": "dev_phone",
                    "name": "This phone",
                    "kind": "phone",
                    "status": "online",
                    "volume": 50,
                },
            ],
            "player": {
                "state": "stopped",
                "context_id": None,
                "track_id": None,
                "device_id": None,
                "shuffle": False,
            },
            "queue": [],
            "history": [],
        }

    # ------------------------------------------------------------------ helpers
    def _region(self) -> str:
        region: str = self.state["account"]["region"]
        return region

    def _track(self, track_id: str) -> dict[str, Any]:
        return self.find("catalog", track_id, what="track")

    def _playable(self, track: dict[str, Any]) -> None:
        region = self._region()
        if region not in track["regions"]:
            raise fail(
                f"track not available in region: '{track['title']}' by {track['artist']} cannot "
                f"be played in {region}"
            )
        if track["explicit"] and self.state["account"].get("explicit_filter"):
            raise fail(f"'{track['title']}' is explicit and the explicit-content filter is on")

    def _playlist(self, playlist_id: str) -> dict[str, Any]:
        return self.find("playlists", playlist_id, what="playlist")

    def _summary(self, p: dict[str, Any]) -> PlaylistSummary:
        return {
            "id": p["id"],
            "name": p["name"],
            "description": p.get("description", ""),
            "track_count": len(p["track_ids"]),
            "max_tracks": p.get("max_tracks", 100),
            "public": p.get("public", False),
            "collaborative": p.get("collaborative", False),
        }

    def _sync(self, p: dict[str, Any]) -> None:
        p["track_count"] = len(p["track_ids"])

    def _device(self, device_id: str | None) -> dict[str, Any]:
        if device_id is None:
            current = self.state["player"].get("device_id") or "dev_phone"
            device_id = current
        device = self.find("devices", device_id, what="device")
        if device["status"] == "offline":
            raise fail(f"device offline: '{device['name']}' is not reachable")
        if device["status"] == "standby":
            raise fail(f"device '{device['name']}' is in standby; wake it with music_wake_device")
        return device

    # ------------------------------------------------------------------ catalog
    @tool()
    def music_get_account(self) -> MusicAccount:
        """The streaming account: plan, region (decides which tracks can play) and filters."""
        return cast(MusicAccount, self.state["account"])

    @tool()
    def music_search(
        self,
        query: Annotated[str, Field(min_length=1, description="Part of a title, artist or album")],
        genre: Genre | None = None,
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Track]:
        """Search the catalog (title, artist, album), most popular first."""
        words = query.lower().split()
        catalog = self.records("catalog")
        found = self.text_candidates("catalog", "music.search", _track_text, words)
        hits = [
            t
            for t in (catalog if found is None else map(catalog.__getitem__, found))
            if all(w in _track_text(t) for w in words) and (genre is None or t["genre"] == genre)
        ]
        hits.sort(key=lambda t: -t["popularity"])
        return cast(list[Track], paginate(hits, limit, offset))

    @tool()
    def music_get_track(self, track_id: str) -> Track:
        """Get one track by id."""
        return cast(Track, self._track(track_id))

    @tool()
    def music_artist_top_tracks(
        self,
        artist: Annotated[str, Field(min_length=1, description="Exact artist name")],
        limit: Annotated[int, Field(ge=1, le=20)] = 5,
    ) -> list[Track]:
        """An artist's most popular tracks, most popular first (all regions)."""
        catalog = self.records("catalog")
        source: Any = catalog
        if type(catalog) is FrozenList:  # committed: the artist's tracks by a kept index
            try:
                positions = catalog.derived("music.by_artist", _by_artist).get(artist.lower(), [])
                source = map(catalog.__getitem__, positions[:limit])  # already most popular first
            except (AttributeError, KeyError, TypeError):  # a malformed record: scan
                source = catalog
        rows = [t for t in source if t["artist"].lower() == artist.lower()]
        if not rows:
            raise fail(f"no artist named '{artist}' in the catalog")
        rows.sort(key=lambda t: -t["popularity"])
        return cast(list[Track], rows[:limit])

    # ------------------------------------------------------------------ playlists
    @tool()
    def music_list_playlists(self) -> list[PlaylistSummary]:
        """List the user's playlists."""
        return [self._summary(p) for p in self.records("playlists")]

    @tool()
    def music_get_playlist(
        self,
        playlist_id: str,
        limit: Annotated[int, Field(ge=1, le=100)] = 50,
        offset: Offset = 0,
    ) -> Playlist:
        """A playlist with its tracks (paginated)."""
        p = self._playlist(playlist_id)
        catalog = {t["id"]: t for t in self.records("catalog")}
        ids = paginate(p["track_ids"], limit, offset)
        tracks = [cast(Track, catalog[i]) for i in ids if i in catalog]
        return {**self._summary(p), "track_ids": list(p["track_ids"]), "tracks": tracks}

    @tool("write")
    def music_create_playlist(
        self,
        name: Annotated[str, Field(min_length=1, max_length=100)],
        description: Annotated[str, Field(max_length=300)] = "",
        public: bool = False,
    ) -> PlaylistSummary:
        """Create an empty playlist (names are unique, case-insensitive)."""
        if any(p["name"].lower() == name.lower() for p in self.records("playlists")):
            raise fail(f"a playlist named '{name}' already exists")
        record = {
            "id": self.world.new_id("pl"),
            "name": name,
            "description": description,
            "public": public,
            "collaborative": False,
            "max_tracks": 100,
            "track_ids": [],
            "track_count": 0,
            "created": self.world.iso_now(),
        }
        self.records("playlists").append(record)
        return self._summary(record)

    @tool("write")
    def music_add_tracks(self, playlist_id: str, track_ids: TrackIds) -> AddResult:
        """Append tracks to a playlist; tracks already in it are skipped."""
        p = self._playlist(playlist_id)
        new: list[str] = []
        dupes: list[str] = []
        for tid in track_ids:
            self._playable(self._track(tid))
            if tid in p["track_ids"] or tid in new:
                dupes.append(tid)
            else:
                new.append(tid)
        cap = p.get("max_tracks", 100)
        if len(p["track_ids"]) + len(new) > cap:
            raise fail(
                f"playlist full: '{p['name']}' has {len(p['track_ids'])} of {cap} tracks; "
                f"cannot add {len(new)} more"
            )
        p["track_ids"].extend(new)
        self._sync(p)
        return {
            "playlist_id": p["id"],
            "added": new,
            "skipped_duplicates": dupes,
            "track_count": len(p["track_ids"]),
        }

    @tool("write")
    def music_remove_tracks(self, playlist_id: str, track_ids: TrackIds) -> PlaylistSummary:
        """Remove tracks from a playlist."""
        p = self._playlist(playlist_id)
        missing = [t for t in track_ids if t not in p["track_ids"]]
        if missing:
            raise fail(f"not in playlist '{p['name']}': {', '.join(missing)}")
        p["track_ids"] = [t for t in p["track_ids"] if t not in track_ids]
        self._sync(p)
        return self._summary(p)

    @tool("write")
    def music_update_playlist(
        self,
        playlist_id: str,
        name: Annotated[str | None, Field(min_length=1, max_length=100)] = None,
        description: Annotated[str | None, Field(max_length=300)] = None,
        public: bool | None = None,
        collaborative: bool | None = None,
    ) -> PlaylistSummary:
        """Rename a playlist or change its description, visibility or collaboration."""
        p = self._playlist(playlist_id)
        given = updates(
            "nothing to update",
            name=name,
            description=description,
            public=public,
            collaborative=collaborative,
        )
        if name is not None and any(
            o["name"].lower() == name.lower() and o is not p for o in self.records("playlists")
        ):
            raise fail(f"a playlist named '{name}' already exists")
        if given.get("collaborative") and p.get("public", False) and public is not False:
            raise fail("a collaborative playlist must be private: set public=false as well")
        p.update(given)
        return self._summary(p)

    @tool("write")
    def music_delete_playlist(self, playlist_id: str) -> PlaylistSummary:
        """Delete a playlist."""
        p = self._playlist(playlist_id)
        self.records("playlists").remove(p)
        return self._summary(p)

    # ------------------------------------------------------------------ library
    @tool("write")
    def music_like_track(self, track_id: str) -> Liked:
        """Save a track to Liked Songs."""
        self._track(track_id)
        liked = self.records("liked")
        if any(r["track_id"] == track_id for r in liked):
            raise fail(f"track {track_id} is already liked")
        record: Liked = {"track_id": track_id, "time": self.world.iso_now()}
        liked.append(dict(record))
        return record

    @tool("write")
    def music_unlike_track(self, track_id: str) -> Liked:
        """Remove a track from Liked Songs."""
        liked = self.records("liked")
        for r in liked:
            if r["track_id"] == track_id:
                liked.remove(r)
                return cast(Liked, r)
        raise fail(f"track {track_id} is not in Liked Songs")

    @tool()
    def music_list_liked(
        self,
        limit: Limit = 20,
        offset: Offset = 0,
    ) -> list[Track]:
        """Liked Songs, most recently liked first."""
        catalog = {t["id"]: t for t in self.records("catalog")}
        rows = sorted(self.records("liked"), key=lambda r: r["time"], reverse=True)
        tracks = [catalog[r["track_id"]] for r in rows if r["track_id"] in catalog]
        return cast(list[Track], paginate(tracks, limit, offset))

    @tool()
    def music_recently_played(self, limit: Limit = 10) -> list[Played]:
        """Listening history, most recent first."""
        tracks = self.records("catalog")
        catalog: dict[Any, Any] | None = None
        if type(tracks) is not FrozenList or tracks.duplicate_ids() or not tracks.all_keyed():
            catalog = {t["id"]: t for t in tracks}  # the last of equal ids, as before
        rows = sorted(self.records("history"), key=lambda r: r["played_at"], reverse=True)
        out: list[Played] = []
        for r in rows[:limit]:
            if catalog is None:  # committed, one record per id: the id index
                at = tracks.position(r["track_id"])  # type: ignore[attr-defined]
                t = tracks[at] if at is not None else {}
            else:
                t = catalog.get(r["track_id"], {})
            out.append(
                {
                    "track_id": r["track_id"],
                    "title": t.get("title", "?"),
                    "artist": t.get("artist", "?"),
                    "played_at": r["played_at"],
                }
            )
        return out

    # ------------------------------------------------------------------ playback
    @tool()
    def music_list_devices(self) -> list[Device]:
        """Devices music can play on, with status (online / standby / offline) and volume."""
        return cast(list[Device], self.records("devices"))

    @tool("write")
    def music_wake_device(self, device_id: str) -> Device:
        """Wake a speaker or TV from standby so it can play."""
        device = self.find("devices", device_id, what="device")
        if device["status"] == "offline":
            raise fail(f"device offline: '{device['name']}' is not reachable")
        device["status"] = "online"
        return cast(Device, device)

    @tool("write")
    def music_play(
        self,
        context_id: Annotated[str, Field(min_length=1, description="A track or playlist id")],
        device_id: Annotated[str | None, Field(description="Default: the current device")] = None,
        shuffle: bool = False,
    ) -> NowPlaying:
        """Start playing a track or a playlist, optionally on another device."""
        if any(p["id"] == context_id for p in self.records("playlists")):
            p = self._playlist(context_id)
            if not p["track_ids"]:
                raise fail(f"playlist '{p['name']}' is empty")
            catalog = {t["id"]: t for t in self.records("catalog")}
            candidates = [catalog[i] for i in p["track_ids"] if i in catalog]
            playable = [t for t in candidates if self._region() in t["regions"]]
            if not playable:
                raise fail(f"no track of '{p['name']}' is available in {self._region()}")
            track = playable[0]
        else:
            track = self._track(context_id)
            self._playable(track)
        device = self._device(device_id)
        player = self.state["player"]
        player.update(
            {
                "state": "playing",
                "context_id": context_id,
                "track_id": track["id"],
                "device_id": device["id"],
                "shuffle": shuffle,
            }
        )
        self.records("history").append({"track_id": track["id"], "played_at": self.world.iso_now()})
        return cast(NowPlaying, {**player, "track": track})

    @tool("write")
    def music_pause(self) -> Player:
        """Pause playback."""
        player = self.state["player"]
        if player["state"] != "playing":
            raise fail("nothing is playing")
        player["state"] = "paused"
        return cast(Player, player)

    @tool("write")
    def music_set_volume(
        self,
        level: Annotated[int, Field(ge=0, le=100, description="Volume percent")],
        device_id: Annotated[str | None, Field(description="Default: the current device")] = None,
    ) -> Device:
        """Set the volume of a device (0-100)."""
        device = self._device(device_id)
        device["volume"] = level
        return cast(Device, device)

    @tool("write")
    def music_queue_add(self, track_id: str) -> Queued:
        """Add a track to the end of the play queue."""
        self._playable(self._track(track_id))
        queue = self.records("queue")
        record = {"track_id": track_id, "added": self.world.iso_now()}
        queue.append(record)
        return {"track_id": track_id, "added": record["added"], "position": len(queue)}

    @tool()
    def music_now_playing(self) -> NowPlaying:
        """What is playing now, where, and the queue length."""
        player = self.state["player"]
        track = None
        if player.get("track_id"):
            track = next(
                (t for t in self.records("catalog") if t["id"] == player["track_id"]), None
            )
        return cast(NowPlaying, {**player, "track": track})
