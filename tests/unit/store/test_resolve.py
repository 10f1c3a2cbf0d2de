"""`resolve_local` for the locations that need no S3 server: paths, file://, pvc://, hf://, gs://.

What is checked: a local path or `file://` URI resolves to itself and a missing one is named;
`pvc://<claim>/<path>` lands under `$QPA_PVC_ROOT/<claim>` and bad claims or escapes are
refused; `hf://` with `HF_HUB_OFFLINE` set never touches the network and says so, passes the
revision through, and says what to install when `huggingface_hub` is missing; `gs://` and unknown
schemes are refused naming the field; the error survives pickling; the local planner takes a
`file://` or `pvc://` location and reports the location, not the cache path, as its model.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from qpa.store import ResolveError, StoreError, default_cache_dir, resolve_local


def test_local_paths_and_file_uris_resolve_to_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    assert resolve_local(model) == model
    assert resolve_local(str(model)) == model
    assert resolve_local(model.as_uri()) == model
    assert resolve_local(f"file://{rows}") == rows  # one file is fine too
    monkeypatch.chdir(tmp_path)
    assert resolve_local("models/tiny") == model  # relative to the working directory, absolute
    missing = r"^--model-uri file:///nope/x: does not exist \(/nope/x\)$"
    with pytest.raises(ResolveError, match=missing):
        resolve_local("file:///nope/x", field="--model-uri")
    with pytest.raises(ResolveError, match=r"missing: does not exist \(.*/missing\)"):
        resolve_local("missing")
    with pytest.raises(ResolveError, match=r"file://relative/x: file URIs name a local path"):
        resolve_local("file://relative/x")
    with pytest.raises(ResolveError, match="empty location"):
        resolve_local("  ", field="model")


def test_pvc_paths_live_under_the_claim_mount_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QPA_PVC_ROOT", str(tmp_path))
    model = tmp_path / "models-pvc" / "qwen" / "v1"
    model.mkdir(parents=True)
    assert resolve_local("pvc://models-pvc/qwen/v1") == model
    assert resolve_local("pvc://models-pvc/qwen/v1/") == model
    assert resolve_local("pvc://models-pvc") == tmp_path / "models-pvc"
    with pytest.raises(ResolveError, match=r"model pvc://models-pvc/qwen/v2: .* in claim"):
        resolve_local("pvc://models-pvc/qwen/v2", field="model")
    with pytest.raises(ResolveError, match=r"claim 'other' is not mounted at .*QPA_PVC_ROOT"):
        resolve_local("pvc://other/x")
    with pytest.raises(ResolveError, match="not a PersistentVolumeClaim name"):
        resolve_local("pvc://Bad_Claim/x")
    with pytest.raises(ResolveError, match="invalid path"):
        resolve_local("pvc://models-pvc/../../etc/passwd")
    monkeypatch.delenv("QPA_PVC_ROOT")
    with pytest.raises(ResolveError, match="/mnt/pvc/models-pvc"):  # the documented default
        resolve_local("pvc://models-pvc/qwen/v1")


def test_hub_ids_offline_fail_clearly_without_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResolveError) as caught:
        resolve_local("hf://Qwen/Qwen2.5-0.5B@main", field="--model-uri", cache_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith("--model-uri hf://Qwen/Qwen2.5-0.5B@main: the Hub is offline")
    assert "HF_HUB_OFFLINE" in message and "s3://" in message
    with pytest.raises(ResolveError, match="not a Hub repo id"):
        resolve_local("hf://a/b/c")
    with pytest.raises(ResolveError, match="empty revision"):
        resolve_local("hf://org/name@")


def test_hub_snapshot_gets_repo_and_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls: list[dict[str, Any]] = []

    def snapshot_download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(hub, "snapshot_download", snapshot_download)
    assert resolve_local("hf://org/name@v1.2", cache_dir=tmp_path) == tmp_path / "snapshot"
    assert calls == [
        {
            "repo_id": "org/name",
            "revision": "v1.2",
            "cache_dir": tmp_path / "hf",
            "local_files_only": False,
        }
    ]
    resolve_local("hf://gpt2")
    assert calls[-1]["repo_id"] == "gpt2" and calls[-1]["revision"] is None
    assert calls[-1]["cache_dir"] is None  # no cache_dir given: the Hub's own cache


def test_hub_without_the_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ResolveError, match="needs the huggingface_hub package"):
        resolve_local("hf://org/name", field="model")


def test_unsupported_schemes_name_the_field() -> None:
    with pytest.raises(ResolveError) as caught:
        resolve_local("gs://bucket/model", field="policy.modelUri")
    assert str(caught.value).startswith("policy.modelUri gs://bucket/model: gs:// is not supported")
    assert caught.value.field == "policy.modelUri" and caught.value.location == "gs://bucket/model"
    with pytest.raises(ResolveError, match="unsupported scheme 'http'"):
        resolve_local("http://example.com/model")
    error = caught.value
    assert isinstance(error, StoreError) and isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.field == error.field


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QPA_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("QPA_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "qpa"


def test_local_planner_takes_a_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qpa.harness.factory import PlannerSpec

    model = tmp_path / "claims" / "models" / "tiny"
    model.mkdir(parents=True)
    monkeypatch.setenv("QPA_PVC_ROOT", str(tmp_path / "claims"))
    spec = PlannerSpec("local", model_path="pvc://models/tiny")
    assert spec.model_dir == model and spec.policy_model == "pvc://models/tiny"
    assert PlannerSpec("local", model_path=model.as_uri()).model_dir == model
    with pytest.raises(ValueError, match=r"^--model-uri gs://b/m: gs:// is not supported"):
        PlannerSpec("local", model_path="gs://b/m")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a checkpoint folder"):
        PlannerSpec("local", model_path=str(tmp_path / "file"))
