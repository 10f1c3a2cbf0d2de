"""Podcasts: shows, episodes, subscriptions, downloads, an up-next queue and playback."""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import Field
from typing_extensions import TypedDict

from qpa.envs.sandbox.engine import App, Limit, Offset, fail, paginate, tool

Category = Literal[
    "news", "technology", "comedy", "history", "science", "business", "sports", "true crime"
]
EpisodeIds = Annotated[list[str], Field(min_length=1, max_length=50)]


class Show(TypedDict):
    id: str
    title: str
    publisher: str
    category: Category
    description: str


class Episode(TypedDict):
    id: str
    show_id: str
    title: str
    published: str
    duration_s: int
    size_mb: int
    played: bool
    progress_s: int


class Subscription(TypedDict):
    show_id: str
    title: str
    since: str


class Download(TypedDict):
    episode_id: str
    show_id: str
    size_mb: int
    time: str


class QueueItem(TypedDict):
    episode_id: str
    added: str


class PodcastPlayer(TypedDict):
    state: Literal["playing", "paused", "stopped"]
    episode_id: str | None
    position_s: int
    speed: float
    sleep_timer_min: int | None


class Marked(TypedDict):
    changed: list[str]
    played: bool


class PodcastsApp(App):
    name = "podcasts"
    title = "Podcasts"
    description = (
        "Podcasts: find shows, browse episodes, subscribe, download for offline listening, "
        "queue episodes and control playback speed and sleep timer."
    )
    skills = {
        "offline_listening": (
            "Downloads are only allowed for shows you follow: podcasts_subscribe to the show "
            "first, then podcasts_download each episode. Downloads count against the storage "
            "limit; remove old downloads with podcasts_remove_download if it is full."
        ),
        "resume_episode": (
            "'Continue where I left off' means: podcasts_get_episode to read progress_s, then "
            "podcasts_play(episode_id, start_at_s=progress_s). podcasts_play without start_at_s "
            "restarts the episode from 0. Speed and sleep timer are set with "
            "podcasts_set_playback after playback has started."
        ),
        "up_next": (
            "'Play it next' means podcasts_queue_add(position='next'); 'add to my queue' means "
            "position='last'. Playing an episode removes it from the queue."
        ),
    }

    @classmethod
    def default_state(cls) -> dict[str, Any]:
        return {
            "shows": [],
            "episodes": [],
            "subscriptions": [],
            "downloads": [],
            "queue": [],
            "player": {
                "state": "stopped",
                "episode_id": None,
                "position_s": 0,
                "speed": 1.0,
                "sleep_timer_min": None,
            },
            "settings": {"storage_limit_mb": 2000},
        }

    def _show(self, show_id: str) -> dict[str, Any]:
        return self.find("shows", show_id, what="show")

    def _episode(self, episode_id: str) -> dict[str, Any]:
        return self.find("episodes", episode_id, what="episode")

    # ------------------------------------------------------------------ browsing
    @tool()
    def podcasts_search(
        self,
        query: Annotated[str, Field(min_length=1, description="Part of a show title/publisher")],
        category: Category | None = None,
        limit: Limit = 10,
        offset: Offset = 0,
    ) -> list[Show]:
        """Find shows by title or publisher."""
        q = query.lower()
        rows = [
            s
            for s in self.records("shows")
            if (q in s["title"].lower() or q in s["publisher"].lower())
            and (category is None or s["category"] == category)
        ]
        return cast(list[Show], paginate(rows, limit, offset))

    @tool()
    def podcasts_list_episodes(
        self,
        show_id: str,
        unplayed_only: bool = False,
        limit: Limit = 20,
        offset: Offset = 0,
    ) -> list[Episode]:
        """Episodes of a show, newest first."""
        self._show(show_id)
        rows = [
            e
            for e in self.records("episodes")
            if e["show_id"] == show_id and (not unplayed_only or not e["played"])
        ]
        rows.sort(key=lambda e: e["published"], reverse=True)
        return cast(list[Episode], paginate(rows, limit, offset))

    @tool()
    def podcasts_get_episode(self, episode_id: str) -> Episode:
        """One episode, including how far the user has listened (progress_s)."""
        return cast(Episode, self._episode(episode_id))

    # ------------------------------------------------------------------ library
    @tool("write")
    def podcasts_subscribe(self, show_id: str) -> Subscription:
        """Follow a show (new episodes appear in the library)."""
        show = self._show(show_id)
        subs = self.records("subscriptions")
        if any(s["show_id"] == show_id for s in subs):
            raise fail(f"already subscribed to '{show['title']}'")
        record: Subscription = {
            "show_id": show_id,
            "title": show["title"],
            "since": self.world.iso_now(),
        }
        subs.append(dict(record))
        return record

    @tool("write")
    def podcasts_unsubscribe(self, show_id: str) -> Subscription:
        """Stop following a show; its downloads are removed too."""
        subs = self.records("subscriptions")
        for s in subs:
            if s["show_id"] == show_id:
                subs.remove(s)
                self.state["downloads"] = [
                    d for d in self.records("downloads") if d["show_id"] != show_id
                ]
                return cast(Subscription, s)
        raise fail(f"not subscribed to show '{show_id}'")

    @tool()
    def podcasts_list_subscriptions(self) -> list[Subscription]:
        """The shows the user follows."""
        return cast(list[Subscription], self.records("subscriptions"))

    @tool("write")
    def podcasts_download(self, episode_id: str) -> Download:
        """Download an episode for offline listening."""
        ep = self._episode(episode_id)
        if not any(s["show_id"] == ep["show_id"] for s in self.records("subscriptions")):
            raise fail("downloads need a subscription: subscribe to the show first")
        downloads = self.records("downloads")
        if any(d["episode_id"] == episode_id for d in downloads):
            raise fail(f"'{ep['title']}' is already downloaded")
        used = sum(d["size_mb"] for d in downloads)
        limit = self.state["settings"]["storage_limit_mb"]
        if used + ep["size_mb"] > limit:
            raise fail(
                f"storage full: {used} of {limit} MB used, '{ep['title']}' needs {ep['size_mb']} MB"
            )
        record: Download = {
            "episode_id": episode_id,
            "show_id": ep["show_id"],
            "size_mb": ep["size_mb"],
            "time": self.world.iso_now(),
        }
        downloads.append(dict(record))
        return record

    @tool("write")
    def podcasts_remove_download(self, episode_id: str) -> Download:
        """Delete a downloaded episode from the phone."""
        downloads = self.records("downloads")
        for d in downloads:
            if d["episode_id"] == episode_id:
                downloads.remove(d)
                return cast(Download, d)
        raise fail(f"episode '{episode_id}' is not downloaded")

    @tool()
    def podcasts_list_downloads(self) -> list[Download]:
        """Downloaded episodes and their sizes."""
        return cast(list[Download], self.records("downloads"))

    @tool("write")
    def podcasts_mark_played(self, episode_ids: EpisodeIds, played: bool = True) -> Marked:
        """Mark episodes played (progress reset) or unplayed."""
        rows = [self._episode(eid) for eid in episode_ids]
        for e in rows:
            e["played"] = played
            e["progress_s"] = 0
        return {"changed": [e["id"] for e in rows], "played": played}

    # ------------------------------------------------------------------ playback
    @tool("write")
    def podcasts_queue_add(
        self, episode_id: str, position: Literal["next", "last"] = "last"
    ) -> list[QueueItem]:
        """Add an episode to the up-next queue (at the front with position='next')."""
        self._episode(episode_id)
        queue = self.records("queue")
        if any(q["episode_id"] == episode_id for q in queue):
            raise fail(f"episode '{episode_id}' is already queued")
        item = {"episode_id": episode_id, "added": self.world.iso_now()}
        if position == "next":
            queue.insert(0, item)
        else:
            queue.append(item)
        return cast(list[QueueItem], queue)

    @tool()
    def podcasts_get_queue(self) -> list[QueueItem]:
        """The up-next queue in play order."""
        return cast(list[QueueItem], self.records("queue"))

    @tool("write")
    def podcasts_play(
        self,
        episode_id: str,
        start_at_s: Annotated[int, Field(ge=0, description="Position to start from")] = 0,
    ) -> PodcastPlayer:
        """Play an episode from a position (seconds; default the beginning)."""
        ep = self._episode(episode_id)
        if start_at_s >= ep["duration_s"]:
            raise fail(f"start_at_s {start_at_s} is past the end ({ep['duration_s']} s)")
        self.state["queue"] = [q for q in self.records("queue") if q["episode_id"] != episode_id]
        player = self.state["player"]
        player.update({"state": "playing", "episode_id": episode_id, "position_s": start_at_s})
        ep["progress_s"] = start_at_s
        return cast(PodcastPlayer, player)

    @tool("write")
    def podcasts_set_playback(
        self,
        speed: Annotated[float | None, Field(ge=0.5, le=3.0)] = None,
        sleep_timer_min: Annotated[int | None, Field(ge=5, le=120)] = None,
    ) -> PodcastPlayer:
        """Set playback speed (0.5-3.0x) and/or a sleep timer in minutes for the current episode."""
        if speed is None and sleep_timer_min is None:
            raise fail("give speed and/or sleep_timer_min", "invalid_arguments")
        player = self.state["player"]
        if player["state"] == "stopped":
            raise fail("nothing is playing; start an episode first")
        if speed is not None:
            player["speed"] = speed
        if sleep_timer_min is not None:
            player["sleep_timer_min"] = sleep_timer_min
        return cast(PodcastPlayer, player)
