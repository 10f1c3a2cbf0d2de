"""Publish a finished benchmark to an object store: `qpa bench run --report-uri URI`.

A benchmark Job writes its run folder to local (ephemeral) disk; whoever judges it (the
HarnessRelease gate, `qpa.release.verdict`) reads `report.json` from a store URI, `file://` or
`s3://` (endpoint and credentials from `StoreConfig`, never from the URI). `publish_run` copies
the run's files there, each with an atomic put:

- `trajectories.jsonl`, `run.json`, `report.md` and any plots first,
- `report.json` last, so a reader that finds the report also finds everything it points to.

`open_report_store` opens the store before the benchmark starts, so a malformed URI or missing
credentials fail in seconds rather than after hours of episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qpa.bench.report import CAPABILITY_PLOT, REPORT_JSON, REPORT_MD, TOKENS_PLOT
from qpa.bench.run import MANIFEST, TRAJECTORIES
from qpa.store import ArtifactStore, ObjectInfo, StoreConfig, StoreError, open_store

#: Published when present, in this order; `report.json` always comes last.
SIDE_FILES = (TRAJECTORIES, MANIFEST, REPORT_MD, CAPABILITY_PLOT, TOKENS_PLOT)


class PublishError(RuntimeError):
    """The report could not be published (the message names the URI and why)."""


@dataclass(frozen=True)
class Published:
    """Where the report went and every object written."""

    report_uri: str
    objects: tuple[ObjectInfo, ...]


def open_report_store(uri: str, config: StoreConfig | None = None) -> ArtifactStore:
    """The store rooted at the report folder `uri`; `PublishError` names the URI and the fault."""
    if uri.rstrip("/").endswith(".json"):
        raise PublishError(
            f"--report-uri {uri}: names a folder (the run's files go inside it), not a file"
        )
    try:
        return open_store(uri.rstrip("/"), config)
    except (ValueError, StoreError) as exc:
        raise PublishError(f"--report-uri {uri}: {exc}") from None


def publish_run(out_dir: str | Path, store: ArtifactStore) -> Published:
    """Upload the run folder's files to `store`, `report.json` last (each put is atomic)."""
    out = Path(out_dir)
    report = out / REPORT_JSON
    if not report.is_file():
        raise PublishError(f"{report}: no report to publish")
    written: list[ObjectInfo] = []
    try:
        for name in SIDE_FILES:
            path = out / name
            if path.is_file():
                written.append(store.put_file(name, path))
        written.append(store.put_file(REPORT_JSON, report))
    except (OSError, StoreError) as exc:
        raise PublishError(f"publishing {out} to {store.root_uri}: {exc}") from None
    return Published(report_uri=store.uri(REPORT_JSON), objects=tuple(written))
