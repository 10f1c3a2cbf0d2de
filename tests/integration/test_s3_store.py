"""The S3 artifact store against a real S3 server (SeaweedFS `weed mini` on 127.0.0.1).

What is checked: the same API as the file store (put/get/list/delete, files, manifests), large
objects through multipart uploads, hashes recorded and verified (a tampered object is caught),
credentials enforced (wrong, missing, read-only), credentials refused in URIs, missing objects
named by URI, an outage surfacing as `StoreUnavailable`, and the spool riding it out.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
from fakes.seaweed import SeaweedS3

from qpa.store import (
    ArtifactNotFound,
    IntegrityError,
    InvalidKey,
    StoreAccessDenied,
    StoreConfig,
    StoreError,
    StoreUnavailable,
    open_object,
    open_store,
)
from qpa.store.manifest import (
    DatasetManifest,
    Lineage,
    ManifestError,
    ManifestFile,
    read_manifest,
    verify_manifest,
    write_manifest,
)
from qpa.store.s3 import S3Store
from qpa.store.spool import SpooledUploader


@pytest.fixture
def store(seaweed: SeaweedS3, request: pytest.FixtureRequest) -> S3Store:
    opened = open_store(seaweed.root(request.node.name), seaweed.store_config())
    assert isinstance(opened, S3Store)
    return opened


def test_put_get_list_delete_round_trip(store: S3Store) -> None:
    info = store.put_bytes("a/one.txt", b"hello")
    assert info.size == 5 and info.sha256 == hashlib.sha256(b"hello").hexdigest()
    store.put_bytes("a/two.txt", b"world")
    store.put_bytes("b/three.txt", b"!")
    assert store.get_bytes("a/one.txt") == b"hello"
    assert store.exists("a/one.txt") and not store.exists("a/none.txt")
    assert store.list() == ["a/one.txt", "a/two.txt", "b/three.txt"]
    assert store.list("a/") == ["a/one.txt", "a/two.txt"]
    assert store.stat("a/two.txt").sha256 == hashlib.sha256(b"world").hexdigest()
    store.put_bytes("a/one.txt", b"replaced")  # overwrite is atomic
    assert store.get_bytes("a/one.txt") == b"replaced"
    store.delete("a/one.txt")
    store.delete("a/one.txt")  # idempotent
    assert store.list("a/") == ["a/two.txt"]
    assert store.uri("a/two.txt") == f"{store.root_uri}/a/two.txt"
    assert store.root_uri.startswith("s3://qpa-test/")


def test_multipart_file_round_trip_and_verified_download(store: S3Store, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    data = os.urandom(11 * 1024 * 1024 + 123)  # > part size (5 MiB): three parts
    source.write_bytes(data)
    small = S3Store(
        store.bucket, store.prefix, store.config.model_copy(update={"part_size": 5 << 20})
    )
    info = small.put_file("ckpt/model.bin", source)
    assert info.size == len(data) and info.sha256 == hashlib.sha256(data).hexdigest()
    assert store.stat("ckpt/model.bin") == info  # recorded as object metadata
    target = store.get_file("ckpt/model.bin", tmp_path / "out" / "model.bin")
    assert target.read_bytes() == data
    assert not [p for p in target.parent.iterdir() if p.name != "model.bin"]  # no temp left


def test_tampered_object_is_detected(seaweed: SeaweedS3, store: S3Store, tmp_path: Path) -> None:
    store.put_bytes("x.jsonl", b'{"a": 1}\n')
    # Rewrite the bytes behind the store's back, keeping the old hash as metadata.
    recorded = store.stat("x.jsonl").sha256
    seaweed.client().put_object(
        store.bucket, f"{store.prefix}/x.jsonl", io.BytesIO(b'{"a": 2}\n'), 9,
        metadata={"sha256": recorded},
    )  # fmt: skip
    with pytest.raises(IntegrityError, match=r"x\.jsonl"):
        store.get_bytes("x.jsonl")
    with pytest.raises(IntegrityError):
        store.get_file("x.jsonl", tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()  # a bad download never lands


def test_missing_objects_name_the_uri(store: S3Store, tmp_path: Path) -> None:
    with pytest.raises(ArtifactNotFound) as caught:
        store.get_bytes("nope/missing.jsonl")
    assert caught.value.uri == store.uri("nope/missing.jsonl")
    assert "s3://qpa-test/" in str(caught.value)
    with pytest.raises(KeyError):  # ArtifactNotFound is a KeyError too
        store.get_file("nope/missing.jsonl", tmp_path / "m")
    with pytest.raises(ArtifactNotFound, match=r"manifest\.json"):
        read_manifest(store, "no-dataset")
    assert store.list("nope/") == []


def test_credentials_are_enforced(
    seaweed: SeaweedS3, store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put_bytes("secret.txt", b"s")
    wrong = seaweed.store_config(access_key_file=None, secret_key_file=None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    bad = open_store(store.root_uri, wrong)
    with pytest.raises(StoreAccessDenied, match="access denied"):
        bad.get_bytes("secret.txt")
    with pytest.raises(StoreAccessDenied, match="access denied"):
        bad.put_bytes("other.txt", b"x")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StoreAccessDenied, match="no S3 credentials"):
        open_store(store.root_uri, wrong)  # no keys anywhere
    keys = tmp_path / "reader"
    keys.mkdir()
    (keys / "a").write_text(seaweed.reader_key)
    (keys / "s").write_text(seaweed.reader_secret)
    reader = open_store(
        store.root_uri,
        seaweed.store_config(access_key_file=keys / "a", secret_key_file=keys / "s"),
    )
    assert reader.get_bytes("secret.txt") == b"s"  # read-only identity reads
    with pytest.raises(StoreAccessDenied):
        reader.put_bytes("secret.txt", b"overwritten")
    assert store.get_bytes("secret.txt") == b"s"


def test_uris_never_carry_credentials(seaweed: SeaweedS3) -> None:
    config = seaweed.store_config()
    for uri in ("s3://user:pass@qpa-test/x", "s3://key@qpa-test/x"):
        with pytest.raises(ValueError, match="credentials"):
            open_store(uri, config)
    with pytest.raises(ValueError, match="credentials"):
        StoreConfig(endpoint="http://user:pass@127.0.0.1:9000")
    with pytest.raises(ValueError, match="bucket"):
        open_store("s3://UPPER_case/x", config)
    assert seaweed.secret_key not in repr(config) + config.model_dump_json()


def test_bad_keys_are_refused(store: S3Store) -> None:
    for key in ("../escape", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(InvalidKey):
            store.put_bytes(key, b"x")


def test_tasks_uri_and_from_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    root = seaweed.root("from-env")
    store = open_store(root)  # endpoint and keys from the environment
    store.put_bytes("tasks/train.jsonl", b"{}\n")
    parent, key = open_object(f"{root}/tasks/train.jsonl")
    assert key == "train.jsonl" and parent.get_bytes(key) == b"{}\n"


def test_manifest_write_read_verify(store: S3Store) -> None:
    info = store.put_bytes("parts/p0.jsonl", b'{"a":1}\n{"a":2}\n')
    manifest = DatasetManifest(
        name="demo",
        kind="trajectories",
        files=[ManifestFile.of(info, rows=2)],
        lineage=Lineage.for_tasks(["t1", "t2"], generator="templates", policy={"planner": "x"}),
    )
    write_manifest(store, "", manifest)
    assert read_manifest(store) == manifest
    assert verify_manifest(store) == []
    store.put_bytes("parts/p0.jsonl", b'{"a":1}\n')  # changed after the manifest
    problems = verify_manifest(store)
    assert any("sha256" in p for p in problems) and any("rows" in p for p in problems)
    store.put_bytes("manifest.json", b"{not json")
    with pytest.raises(ManifestError, match=r"manifest\.json"):
        read_manifest(store)


def test_outage_raises_unavailable_and_spool_rides_it_out(
    seaweed: SeaweedS3, store: S3Store, tmp_path: Path
) -> None:
    store.put_bytes("before.txt", b"1")
    uploader = SpooledUploader(
        store, "parts", tmp_path / "spool", part_size=2, backoff_s=0.05, max_backoff_s=0.3
    )
    try:
        seaweed.stop()
        with pytest.raises(StoreUnavailable, match="unreachable"):
            store.get_bytes("before.txt")
        for i in range(5):
            uploader.append(f'{{"i": {i}}}')
        with pytest.raises(StoreUnavailable, match="still in spool"):
            uploader.flush(timeout=0.5)
        assert len(uploader.pending()) == 3  # two full parts and the sealed tail
    finally:
        seaweed.start()
    parts = uploader.close(timeout=30)
    assert [p.rows for p in parts] == [2, 2, 1]
    lines = [store.get_bytes(p.key) for p in parts]
    assert b"".join(lines) == b"".join(f'{{"i": {i}}}\n'.encode() for i in range(5))
    assert store.get_bytes("before.txt") == b"1"  # data survived the restart


def test_missing_endpoint_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match="endpoint"):
        open_store("s3://qpa-test/x", StoreConfig())
