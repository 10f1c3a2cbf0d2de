"""Progress of long stages: Rich bars on a terminal, a periodic plain line elsewhere, or nothing.

Every stage that can run longer than a few seconds (loop stages, SFT and RL steps, collection
and benchmark episodes, task generation) reports through `track()`:

    with progress.track("collect", total=len(pending), unit="episodes") as bar:
        for ... :
            bar.advance()

- On a terminal, a Rich progress bar (description, bar, done/total, rate, ETA, elapsed). While
  a `session()` is open (`qpa loop` opens one for the whole run) every `track()` adds its bar
  to the session's display, below the loop's own; Rich allows one live display per console.
- Not on a terminal (CI, a pod's log): at most one plain line every `interval_s`
  (`QPA_PROGRESS_INTERVAL`, default 10 s), the first once that much time has passed, and one
  at the end if any came before: a stage shorter than the interval prints nothing (a script
  reading a short command's output sees only the output), a long one a line per interval:
  `[progress] collect: 120/256 episodes (47%), 3.2 episodes/s, ETA 42s, 38s elapsed`.
- Quiet (`qpa --quiet ...`, `qpa loop --quiet`, `QPA_PROGRESS=off`): nothing.

`QPA_PROGRESS=rich|plain|off` forces a mode. Updates are cheap (a lock and a clock read; the
plain line is formatted only when due; Rich redraws from its own thread at 4 Hz), so the stages
are not slowed. Progress goes to the stream bound at `configure()`/first use (stderr by
default; the loop passes its console), never to a stage's captured log.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

Mode = Literal["rich", "plain", "off"]

DEFAULT_INTERVAL_S = 10.0


class RateColumn(ProgressColumn):
    """Items per second of a task, in its own unit (`3.2 episodes/s`)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        unit = str(task.fields.get("unit", "steps"))
        if speed is None:
            return Text(f"- {unit}/s", style="progress.data.speed")
        return Text(f"{speed:.3g} {unit}/s", style="progress.data.speed")


@dataclass
class _Settings:
    mode: Mode | None = None  # None: decided from the stream (a terminal or not)
    interval_s: float = DEFAULT_INTERVAL_S
    stream: IO[str] | None = None
    console: Console | None = None
    session: Progress | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_SETTINGS = _Settings()


def _env_mode() -> Mode | None:
    value = os.environ.get("QPA_PROGRESS", "").strip().lower()
    if value in ("off", "quiet", "0", "none"):
        return "off"
    if value in ("rich", "plain"):
        return value  # type: ignore[return-value]
    return None


def configure(
    *,
    quiet: bool | None = None,
    mode: Mode | None = None,
    stream: IO[str] | None = None,
    console: Console | None = None,
    interval_s: float | None = None,
) -> None:
    """Set how progress is shown for this process (the CLI calls it once, tests per test)."""
    if quiet:
        mode = "off"
    if mode is not None or quiet is False:
        _SETTINGS.mode = mode
    if stream is not None:
        _SETTINGS.stream = stream
        _SETTINGS.console = None
    if console is not None:
        _SETTINGS.console = console
        _SETTINGS.stream = console.file
    if interval_s is not None:
        _SETTINGS.interval_s = interval_s


def reset() -> None:
    """Back to the defaults (stderr, mode from the environment and the terminal)."""
    global _SETTINGS
    _SETTINGS = _Settings()


def interval_s() -> float:
    raw = os.environ.get("QPA_PROGRESS_INTERVAL")
    if raw:
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass
    return _SETTINGS.interval_s


def _stream() -> IO[str]:
    return _SETTINGS.stream or sys.stderr


def _console() -> Console:
    if _SETTINGS.console is not None:
        return _SETTINGS.console
    if _SETTINGS.stream is not None:
        _SETTINGS.console = Console(file=_SETTINGS.stream, soft_wrap=True)
        return _SETTINGS.console
    return Console(file=sys.stderr, soft_wrap=True)  # follows a redirected stderr


def mode() -> Mode:
    """The mode in effect: forced (configure, QPA_PROGRESS), else rich on a terminal."""
    forced = _SETTINGS.mode or _env_mode()
    if forced is not None:
        return forced
    return "rich" if _console().is_terminal else "plain"


def _new_progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        RateColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
        console=console,
        redirect_stdout=False,
        redirect_stderr=False,
        transient=True,
        refresh_per_second=4,
    )


@contextlib.contextmanager
def session(console: Console | None = None) -> Iterator[Progress | None]:
    """One live display for a run of several stages (`qpa loop`); `track()` bars join it.

    Yields the Rich `Progress` on a terminal, None otherwise (plain lines or quiet).
    """
    saved = (_SETTINGS.console, _SETTINGS.stream)
    if console is not None:
        configure(console=console)
    try:
        if mode() != "rich" or _SETTINGS.session is not None:
            yield _SETTINGS.session
            return
        progress = _new_progress(_console())
        _SETTINGS.session = progress
        try:
            with progress:
                yield progress
        finally:
            _SETTINGS.session = None
    finally:
        _SETTINGS.console, _SETTINGS.stream = saved


def _duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Tracker:
    """One stage's progress: `advance()` as items finish, `update()` to set the count."""

    def __init__(
        self,
        description: str,
        total: int | None,
        unit: str,
        shown: Mode,
        progress: Progress | None,
        stream: IO[str],
        every_s: float,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0
        self._mode = shown
        self._progress = progress
        self._task: TaskID | None = None
        self._stream = stream
        self._every_s = every_s
        self._started = time.monotonic()
        self._next_line = self._started + every_s
        self._lock = threading.Lock()
        self._printed = False
        if progress is not None:
            self._task = progress.add_task(description, total=total, unit=unit)

    def advance(self, amount: int = 1) -> None:
        self.update(self.completed + amount)

    def describe(self, description: str) -> None:
        """A new description (the loop's current stage); a plain line says it at once."""
        with self._lock:
            self.description = description
            if self._progress is not None and self._task is not None:
                self._progress.update(self._task, description=description)
            elif self._mode == "plain":
                self._next_line = time.monotonic() + self._every_s
                self._line()

    def update(self, completed: int, *, total: int | None = None) -> None:
        with self._lock:
            self.completed = completed
            if total is not None:
                self.total = total
            if self._progress is not None and self._task is not None:
                self._progress.update(self._task, completed=completed, total=self.total)
            elif self._mode == "plain":
                now = time.monotonic()
                if now >= self._next_line:
                    self._next_line = now + self._every_s
                    self._line(now)

    def line(self, now: float | None = None) -> str:
        """The plain line: `desc: done/total unit (pct), rate unit/s, ETA t`."""
        elapsed = (now or time.monotonic()) - self._started
        rate = self.completed / elapsed if elapsed > 0 else 0.0
        done = f"{self.completed}/{self.total}" if self.total is not None else f"{self.completed}"
        text = f"[progress] {self.description}: {done} {self.unit}"
        if self.total:
            text += f" ({self.completed / self.total:.0%})"
        text += f", {rate:.3g} {self.unit}/s"
        if self.total is not None and rate > 0 and self.completed < self.total:
            text += f", ETA {_duration((self.total - self.completed) / rate)}"
        return text + f", {_duration(elapsed)} elapsed"

    def _line(self, now: float | None = None) -> None:
        self._printed = True
        try:
            self._stream.write(self.line(now) + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed stream must not fail the stage
            pass

    def close(self) -> None:
        with self._lock:
            if self._progress is not None and self._task is not None:
                self._progress.remove_task(self._task)
                self._task = None
            elif self._mode == "plain" and self._printed:
                self._line()


@contextlib.contextmanager
def track(description: str, total: int | None, unit: str = "steps") -> Iterator[Tracker]:
    """Progress of one stage for the block (see the module docstring)."""
    shown = mode()
    stream = _stream()
    own: Progress | None = None
    shared = _SETTINGS.session
    if shown == "rich" and shared is None:
        own = _new_progress(_console())
        own.start()
    tracker = Tracker(
        description,
        total,
        unit,
        shown,
        (shared or own) if shown == "rich" else None,
        stream,
        interval_s(),
    )
    try:
        yield tracker
    finally:
        tracker.close()
        if own is not None:
            own.stop()


__all__ = [
    "DEFAULT_INTERVAL_S",
    "RateColumn",
    "Tracker",
    "configure",
    "interval_s",
    "mode",
    "reset",
    "session",
    "track",
]
