"""`resolve_local` against a real S3 server (SeaweedFS `weed mini`): models and datasets by URI.

What is checked: an `s3://` folder lands in the cache whole, a second call reuses it without a
download, a changed remote (a rewritten or added object) gives a fresh copy and drops the old
one, a download that fails midway or whose process is killed midway is never taken as complete
(and the dead process's leftovers are swept), one object resolves to its file, an empty prefix
and missing credentials are named, and the local planner built from an `s3://` model URI loads
the (tiny) checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fakes.seaweed import SeaweedS3

from qpa.store import ResolveError, StoreUnavailable, open_store, resolve_local
from qpa.store.s3 import S3Store

FILES = {
    "config.json": b'{"model_type": "toy"}',
    "model.safetensors": os.urandom(300_000),
    "tokenizer/vocab.txt": b"a\nb\nc\n",
}


def upload(store: Any, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        store.put_bytes(key, data)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def model_uri(seaweed: SeaweedS3, request: pytest.FixtureRequest) -> str:
    uri = seaweed.root(request.node.name)
    upload(open_store(uri, seaweed.store_config()), FILES)
    return uri


def counting_downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    fetched: list[str] = []
    real = S3Store.get_file

    def get_file(self: S3Store, key: str, path: str | Path) -> Path:
        fetched.append(key)
        return real(self, key, path)

    monkeypatch.setattr(S3Store, "get_file", get_file)
    return fetched


def test_s3_folder_is_cached_and_reused(
    seaweed: SeaweedS3, model_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = seaweed.store_config()
    fetched = counting_downloads(monkeypatch)
    local = resolve_local(model_uri, cache_dir=tmp_path, store_config=config)
    assert local.is_relative_to(tmp_path / "store") and tree(local) == FILES
    assert sorted(fetched) == sorted(FILES)
    again = resolve_local(model_uri + "/", cache_dir=tmp_path, store_config=config)
    assert again == local and sorted(fetched) == sorted(FILES)  # same listing: no download
    # a copy pruned by hand is not trusted: it is downloaded again
    (local / "model.safetensors").unlink()
    repaired = resolve_local(model_uri, cache_dir=tmp_path, store_config=config)
    assert tree(repaired) == FILES and len(fetched) == 2 * len(FILES)


def test_changed_remote_gives_a_fresh_copy(
    seaweed: SeaweedS3, model_uri: str, tmp_path: Path
) -> None:
    config = seaweed.store_config()
    store = open_store(model_uri, config)
    first = resolve_local(model_uri, cache_dir=tmp_path, store_config=config)
    store.put_bytes("config.json", b'{"model_type": "toy", "v": 2}')
    second = resolve_local(model_uri, cache_dir=tmp_path, store_config=config)
    assert second != first and not first.exists()  # the stale copy is dropped
    assert (second / "config.json").read_bytes() == b'{"model_type": "toy", "v": 2}'
    store.put_bytes("extra/added.bin", b"new")
    third = resolve_local(model_uri, cache_dir=tmp_path, store_config=config)
    assert (third / "extra" / "added.bin").read_bytes() == b"new" and not second.exists()


def test_failed_download_is_never_complete(
    seaweed: SeaweedS3, model_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = seaweed.store_config()
    real = S3Store.get_file
    calls: list[str] = []

    def flaky(self: S3Store, key: str, path: str | Path) -> Path:
        calls.append(key)
        if len(calls) == 2:
            raise StoreUnavailable(f"{self.uri(key)}: connection reset")
        return real(self, key, path)

    monkeypatch.setattr(S3Store, "get_file", flaky)
    with pytest.raises(ResolveError, match=f"^model {model_uri}: .*connection reset"):
        resolve_local(model_uri, field="model", cache_dir=tmp_path, store_config=config)
    entry = next((tmp_path / "store").iterdir())
    assert list(entry.iterdir()) == []  # no version, no temporary folder left behind
    monkeypatch.setattr(S3Store, "get_file", real)
    assert tree(resolve_local(model_uri, cache_dir=tmp_path, store_config=config)) == FILES


def test_killed_download_is_never_complete(
    seaweed: SeaweedS3, model_uri: str, tmp_path: Path
) -> None:
    """A process killed mid-download leaves a temporary folder that nobody takes for a copy."""
    script = textwrap.dedent(
        f"""
        import os
        from qpa.store import resolve_local
        from qpa.store.s3 import S3Store

        real = S3Store.get_file
        def dying(self, key, path):
            real(self, key, path)
            os._exit(9)  # killed after the first object

        S3Store.get_file = dying
        resolve_local({model_uri!r}, cache_dir={str(tmp_path)!r})
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **seaweed.env()},
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 9, done.stderr.decode()
    entry = next((tmp_path / "store").iterdir())
    (leftover,) = entry.iterdir()
    assert leftover.name.startswith(".tmp-") and any(leftover.rglob("*.*"))
    local = resolve_local(model_uri, cache_dir=tmp_path, store_config=seaweed.store_config())
    assert tree(local) == FILES
    assert not leftover.exists()  # its process is gone: swept
    assert [p.name for p in entry.iterdir()] == [local.parent.name]


def test_one_object_resolves_to_its_file(
    seaweed: SeaweedS3, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    config = seaweed.store_config()
    root = seaweed.root(request.node.name)
    store = open_store(root, config)
    store.put_bytes("data/rows.jsonl", b'{"a": 1}\n')
    store.put_bytes("data/rows.jsonl.bak", b"old")  # shares the prefix, not the name
    uri = f"{root}/data/rows.jsonl"
    local = resolve_local(uri, cache_dir=tmp_path, store_config=config)
    assert local.name == "rows.jsonl" and local.read_bytes() == b'{"a": 1}\n'
    assert [p.name for p in local.parent.iterdir()] == ["rows.jsonl"]
    assert resolve_local(uri, cache_dir=tmp_path, store_config=config) == local


def test_missing_things_are_named(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = seaweed.root("empty")
    with pytest.raises(ResolveError, match=f"^dataset {empty}: nothing is stored there$"):
        resolve_local(
            empty, field="dataset", cache_dir=tmp_path, store_config=seaweed.store_config()
        )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    no_keys = seaweed.store_config(access_key_file=None, secret_key_file=None)
    with pytest.raises(ResolveError, match=f"^model {empty}: no S3 credentials"):
        resolve_local(empty, field="model", cache_dir=tmp_path, store_config=no_keys)


def test_local_planner_loads_a_model_from_s3(
    seaweed: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from qpa.harness.factory import PlannerFactory, PlannerSpec
    from qpa.train.tiny import TinyConfig, make_tiny_checkpoint

    tiny = TinyConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, num_hidden_layers=1,
    )  # fmt: skip
    checkpoint = make_tiny_checkpoint(
        tmp_path / "tiny", tiny, corpus=["find the cheapest flight", "send a message"] * 50
    )
    uri = seaweed.root("planner-model")
    store = open_store(uri, seaweed.store_config())
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        store.put_file(path.relative_to(checkpoint).as_posix(), path)
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("QPA_CACHE_DIR", str(tmp_path / "cache"))
    spec = PlannerSpec("local", model_path=uri)
    assert spec.model_dir is not None and spec.model_dir.is_relative_to(tmp_path / "cache")
    assert spec.policy_model == uri  # reports name the model by its location, not the cache
    factory = PlannerFactory(spec)
    factory.warm()
    backend = factory._shared_backend()
    assert backend.loaded and backend.model_path == spec.model_dir
