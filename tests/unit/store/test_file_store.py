"""The file store, URIs and config, manifests and the spool, all on the local filesystem.

What is checked: atomic writes leave no temp files and never show half a file, keys cannot
escape the root, missing objects name their URI, URIs never carry credentials, config reads
secrets from files before the environment, manifests round-trip and verification catches
changed files, and the spool names parts deterministically, repairs a torn part after a crash,
and never uploads a part twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from qpa.contract import CorruptLineError
from qpa.store import (
    ArtifactNotFound,
    ArtifactStore,
    FileStore,
    InvalidKey,
    ObjectInfo,
    StoreAccessDenied,
    StoreConfig,
    StoreUnavailable,
    open_object,
    open_store,
    split_uri,
)
from qpa.store.manifest import (
    DatasetManifest,
    Lineage,
    ManifestError,
    ManifestFile,
    read_manifest,
    tasks_digest,
    verify_manifest,
    write_manifest,
)
from qpa.store.spool import PartConflict, SpoolBusy, SpooledUploader, part_name, repair_part


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "root")


def test_put_get_list_delete(store: FileStore, tmp_path: Path) -> None:
    info = store.put_bytes("a/b/c.txt", b"hello")
    assert info == ObjectInfo("a/b/c.txt", 5, hashlib.sha256(b"hello").hexdigest())
    store.put_bytes("a/d.txt", b"x")
    store.put_bytes("z.txt", b"y")
    assert store.get_bytes("a/b/c.txt") == b"hello"
    assert store.list() == ["a/b/c.txt", "a/d.txt", "z.txt"]
    assert store.list("a/") == ["a/b/c.txt", "a/d.txt"]
    assert store.list("a/b") == ["a/b/c.txt"]
    assert store.list("missing/") == []
    assert store.exists("a/d.txt") and not store.exists("a") and not store.exists("nope")
    assert store.stat("a/b/c.txt") == info
    store.delete("a/d.txt")
    store.delete("a/d.txt")  # deleting a missing key is fine
    assert store.list("a/") == ["a/b/c.txt"]
    assert store.uri("a/b/c.txt") == (tmp_path / "root" / "a/b/c.txt").as_uri()
    assert isinstance(store, ArtifactStore)


def test_files_round_trip_atomically(store: FileStore, tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    data = os.urandom(3 * 1024 * 1024 + 7)
    source.write_bytes(data)
    info = store.put_file("ckpt/model.bin", source)
    assert info.sha256 == hashlib.sha256(data).hexdigest() and info.size == len(data)
    target = store.get_file("ckpt/model.bin", tmp_path / "dl" / "model.bin")
    assert target.read_bytes() == data
    leftovers = [p for p in (tmp_path / "root").rglob("*") if ".qpa-tmp-" in p.name]
    assert leftovers == []


def test_readers_never_see_a_partial_object(store: FileStore) -> None:
    big, small = b"A" * 4_000_000, b"B" * 10
    store.put_bytes("obj", small)
    seen: set[bytes] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            data = store.get_bytes("obj")
            seen.add(data[:1] + str(len(data)).encode())

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(20):
        store.put_bytes("obj", big)
        store.put_bytes("obj", small)
    done.set()
    reader.join()
    assert seen <= {b"A4000000", b"B10"}


def test_missing_and_bad_keys(store: FileStore, tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFound) as caught:
        store.get_bytes("no/such.jsonl")
    assert caught.value.uri.endswith("/root/no/such.jsonl")
    assert "not found" in str(caught.value) and isinstance(caught.value, KeyError)
    with pytest.raises(ArtifactNotFound):
        store.get_file("no/such.jsonl", tmp_path / "x")
    with pytest.raises(ArtifactNotFound):
        store.stat("no/such.jsonl")
    for key in ("../escape", "/etc/passwd", "a/../../b", "a//b", "", "a\\b", "a/./b", "x\n"):
        with pytest.raises(InvalidKey):
            store.put_bytes(key, b"x")
    assert not (tmp_path / "escape").exists()


def test_open_store_parses_roots(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path), FileStore)
    uri_store = open_store(tmp_path.as_uri())
    assert isinstance(uri_store, FileStore) and uri_store.root == tmp_path.resolve()
    assert open_store(str(tmp_path)).root_uri == tmp_path.resolve().as_uri()
    for bad in ("ftp://host/x", "file://otherhost/x", "s3://user:pw@bucket/x", "s3://a@b/x"):
        with pytest.raises(ValueError):
            open_store(bad)
    assert split_uri("s3://bucket/p/q/tasks.jsonl") == ("s3://bucket/p/q", "tasks.jsonl")
    assert split_uri("s3://bucket/tasks.jsonl") == ("s3://bucket", "tasks.jsonl")
    (tmp_path / "t.jsonl").write_text("{}\n")
    parent, key = open_object(tmp_path / "t.jsonl")
    assert key == "t.jsonl" and parent.get_bytes(key) == b"{}\n"


def test_config_reads_secret_files_before_the_environment(tmp_path: Path) -> None:
    (tmp_path / "ak").write_text("from-file\n")
    (tmp_path / "sk").write_text("file-secret\n")
    env = {
        "QPA_S3_ENDPOINT": "https://minio.example:9000",
        "QPA_S3_ACCESS_KEY_FILE": str(tmp_path / "ak"),
        "QPA_S3_SECRET_KEY_FILE": str(tmp_path / "sk"),
        "AWS_ACCESS_KEY_ID": "from-env",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_REGION": "eu-west-1",
    }
    config = StoreConfig.from_env(env)
    assert config.host == "minio.example:9000" and config.use_tls and config.region == "eu-west-1"
    assert config.credentials(env) == ("from-file", "file-secret", None)
    plain = StoreConfig.from_env({"QPA_S3_ENDPOINT": "http://127.0.0.1:9000", **env})
    assert not StoreConfig(endpoint="http://127.0.0.1:9000").use_tls and plain.endpoint
    only_env = StoreConfig(endpoint="127.0.0.1:9000")
    assert only_env.use_tls  # no scheme: TLS unless told otherwise
    assert only_env.credentials(env)[:2] == ("from-env", "env-secret")
    with pytest.raises(StoreAccessDenied, match="AWS_ACCESS_KEY_ID"):
        only_env.credentials({})
    with pytest.raises(ValueError, match="credentials"):
        StoreConfig(endpoint="http://ak:sk@minio:9000")
    with pytest.raises(ValueError, match="QPA_S3_SECURE"):
        StoreConfig.from_env({"QPA_S3_SECURE": "maybe"})
    assert "file-secret" not in repr(config)


def test_manifest_round_trip_and_verification(store: FileStore) -> None:
    info = store.put_bytes("data/part-0.jsonl", b'{"a": 1}\n{"a": 2}\n')
    manifest = DatasetManifest(
        name="demo",
        kind="trajectories",
        files=[ManifestFile.of(info, rows=2)],
        counts={"trajectories": 2},
        lineage=Lineage.for_tasks(["t2", "t1", "t1"], generator="templates", parents=["s3://b/x"]),
        weights={"tool_use": 0.5},
        reasons=["kept"],
    )
    assert manifest.lineage.tasks == ["t1", "t2"] and manifest.lineage.task_count == 2
    assert manifest.lineage.tasks_sha256 == tasks_digest(["t1", "t2"])
    assert Lineage.for_tasks([f"t{i}" for i in range(5)], max_listed=3).tasks == []
    write_manifest(store, "", manifest)
    assert read_manifest(store) == manifest and manifest.rows == 2
    assert verify_manifest(store) == []
    store.put_bytes("data/part-0.jsonl", b'{"a": 1}\n')
    problems = verify_manifest(store)
    assert len(problems) == 3 and all("part-0.jsonl" in p for p in problems)
    store.delete("data/part-0.jsonl")
    assert verify_manifest(store) == [f"{store.uri('data/part-0.jsonl')}: missing"]
    with pytest.raises(ArtifactNotFound, match=r"sub/manifest\.json"):
        read_manifest(store, "sub")
    store.put_bytes("bad/manifest.json", json.dumps({"name": "x"}).encode())
    with pytest.raises(ManifestError, match=r"bad/manifest\.json.*kind"):
        read_manifest(store, "bad")
    with pytest.raises(ManifestError, match="twice"):
        write_manifest(store, "dup", manifest.model_copy(update={"files": manifest.files * 2}))


# --------------------------------------------------------------------------- spool


def test_spool_parts_are_deterministic_and_complete(store: FileStore, tmp_path: Path) -> None:
    with SpooledUploader(store, "parts", tmp_path / "spool", part_size=3, shard=(2, 4)) as up:
        for i in range(7):
            assert up.append(json.dumps({"i": i})).startswith("part-00002-of-00004-")
    keys = store.list("parts/")
    assert keys == [f"parts/{part_name('00002-of-00004', s)}" for s in range(3)]
    lines = b"".join(store.get_bytes(k) for k in keys).splitlines()
    assert [json.loads(x)["i"] for x in lines] == list(range(7))
    assert [p.rows for p in up.uploaded] == [3, 3, 1]
    # A new uploader for the same shard continues the sequence; never overwrites.
    with SpooledUploader(store, "parts", tmp_path / "spool", part_size=3, shard=(2, 4)) as up:
        up.append('{"i": 7}')
    assert store.list("parts/")[-1].endswith("-000003.jsonl")


def test_spool_recovers_a_crashed_part(store: FileStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    first = SpooledUploader(store, "parts", spool, part_size=100, background=False)
    for i in range(3):
        first.append(json.dumps({"i": i}))
    first.abandon()  # the process "dies": its part stays sealed in the spool
    torn = spool / "open" / part_name("00000-of-00001", 1)
    torn.write_bytes(b'{"i": 3}\n{"i": 4}\n{"i": 5, "cut')  # crash mid-write
    second = SpooledUploader(store, "parts", spool, part_size=100)
    assert second.repaired and "cut short" in second.repaired[0]
    assert [n for _, n, _ in second.iter_spooled_lines()] == [1, 2, 3, 1, 2]
    second.close()
    keys = store.list("parts/")
    rows = [json.loads(x)["i"] for k in keys for x in store.get_bytes(k).splitlines()]
    assert rows == [0, 1, 2, 3, 4]


def test_spool_reports_corrupt_lines_with_numbers(store: FileStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / "open").mkdir(parents=True)
    bad = spool / "open" / part_name("00000-of-00001", 0)
    bad.write_bytes(b'{"ok": 1}\nnot json at all\n{"ok": 2}\n')
    with pytest.raises(CorruptLineError, match=r"part-00000-of-00001-000000\.jsonl:2"):
        SpooledUploader(store, "parts", spool)
    clean = spool / "clean.jsonl"
    clean.write_bytes(b'{"a": 1}\n{"a": 2}')  # only the final newline was lost
    assert repair_part(clean) == (2, True) and clean.read_bytes() == b'{"a": 1}\n{"a": 2}\n'


def test_spool_never_uploads_twice_and_refuses_conflicts(store: FileStore, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    up = SpooledUploader(store, "parts", spool, part_size=2, background=False)
    up.append('{"i": 0}')
    path = up.seal()
    assert path is not None
    key = f"parts/{path.name}"
    store.put_bytes(key, path.read_bytes())  # an earlier, "failed" attempt that did land
    uploaded = up.flush()
    assert [e.key for e in uploaded] == [key] and store.list("parts/") == [key]
    up.append('{"i": 1}')
    second = up.seal()
    assert second is not None
    store.put_bytes(f"parts/{second.name}", b'{"other": true}\n')  # another writer
    with pytest.raises(PartConflict, match="other content"):
        up.flush()
    assert second.exists()  # kept in the spool, not overwritten in the store
    up.abandon()
    other = tmp_path / "other-spool"
    with SpooledUploader(store, "more", other), pytest.raises(SpoolBusy):
        SpooledUploader(store, "more", other)  # one process per spool


class _FlakyStore(FileStore):
    """Fails the first `failures` writes with StoreUnavailable (an outage)."""

    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def put_file(self, key: str, path: str | Path) -> ObjectInfo:
        if self.failures > 0:
            self.failures -= 1
            raise StoreUnavailable("outage")
        return super().put_file(key, path)


def test_spool_retries_through_an_outage(tmp_path: Path) -> None:
    store = _FlakyStore(tmp_path / "root", failures=6)
    up = SpooledUploader(
        store, "parts", tmp_path / "spool", part_size=1, attempts=2, backoff_s=0.01,
        max_backoff_s=0.05,
    )  # fmt: skip
    for i in range(4):
        up.append(json.dumps({"i": i}))
    parts = up.close(timeout=10)
    assert [p.rows for p in parts] == [1, 1, 1, 1] and up.failures >= 1
    assert len(store.list("parts/")) == 4 and up.pending() == []


def test_store_operations_are_counted(store: FileStore) -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    ok = sample("qpa_store_operations_total", backend="file", op="put", outcome="ok")
    missing = sample("qpa_store_operations_total", backend="file", op="get", outcome="not_found")
    written = sample("qpa_store_bytes_total", backend="file", direction="out")
    store.put_bytes("m.bin", b"12345")
    with pytest.raises(ArtifactNotFound):
        store.get_bytes("absent.bin")
    assert sample("qpa_store_operations_total", backend="file", op="put", outcome="ok") == ok + 1
    assert (
        sample("qpa_store_operations_total", backend="file", op="get", outcome="not_found")
        == missing + 1
    )
    assert sample("qpa_store_bytes_total", backend="file", direction="out") == written + 5
    assert sample("qpa_store_operation_seconds_count", backend="file", op="put") >= 1
