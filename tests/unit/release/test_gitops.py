"""`qpa release promote`: a real git repository in tmp_path, written and committed with dulwich.

The HarnessRelease comes from a status file (as `kubectl get qhr -o yaml` writes it) or from the
test API server through the kubernetes client; its status is the one the operator's state
machine writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from dulwich import porcelain
from dulwich.repo import Repo
from helpers.release_reports import judged_release
from typer.testing import CliRunner

from qpa.api import HarnessRelease
from qpa.cli import app
from qpa.release.gitops import PromotionError, promote
from qpa.release.promotion import promotable

AUTHOR = "Release Bot <bot@example.com>"
runner = CliRunner()


def write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))


@pytest.fixture
def gitops(tmp_path: Path) -> Path:
    """A GitOps repository: base + staging and prod overlays, one commit."""
    repo = tmp_path / "gitops-repo"
    repo.mkdir()
    porcelain.init(str(repo))
    root = repo / "gitops"
    write(root / "base" / "kustomization.yaml", {"resources": ["harnessrelease.yaml"]})
    base = judged_release(harness="harness-v3", model="s3://qpa/models/a/")
    base.pop("status")
    write(root / "base" / "harnessrelease.yaml", base)
    for env in ("staging", "prod"):
        write(
            root / "overlays" / env / "kustomization.yaml",
            "# the prod overlay (comments are kept until the first promotion)\n"
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            "resources:\n- ../../base\nnamespace: " + env + "\n",
        )
    porcelain.add(str(repo), [str(p) for p in root.rglob("*.yaml")])
    porcelain.commit(
        str(repo), message=b"layout", author=AUTHOR.encode(), committer=AUTHOR.encode()
    )
    return repo


def status_file(tmp_path: Path, **kwargs: Any) -> Path:
    path = tmp_path / "hr.yaml"
    path.write_text(yaml.safe_dump(judged_release(**kwargs)))
    return path


def said(result: Any) -> str:
    """The command's output with Rich's line wrapping undone."""
    return " ".join(result.output.split())


def head_message(repo: Path) -> str:
    r = Repo(str(repo))
    return r[r.head()].message.decode()


def commits(repo: Path) -> int:
    r = Repo(str(repo))
    return sum(1 for _ in r.get_walker())


def test_a_passed_release_is_committed_into_the_target_overlay(
    gitops: Path, tmp_path: Path
) -> None:
    result = runner.invoke(
        app,
        ["release", "promote", "--repo", str(gitops), "--from", "staging", "--to", "prod",
         "--release", "planner", "--status-file", str(status_file(tmp_path)),
         "--author", AUTHOR],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "committed" in said(result)
    prod = gitops / "gitops" / "overlays" / "prod"
    patch = yaml.safe_load((prod / "harnessrelease-planner.yaml").read_text())
    assert patch["kind"] == "HarnessRelease" and patch["metadata"]["name"] == "planner"
    assert patch["spec"]["model"] == {
        "uri": "s3://qpa/models/b/",
        "runtime": "vllm",
        "servedModelName": "planner",
    }
    assert patch["spec"]["harness"]["version"] == "harness-v4"
    assert patch["spec"]["harness"]["configMapRef"] == {"name": "harness-v3", "key": "harness.yaml"}
    notes = patch["metadata"]["annotations"]
    assert notes["qpa.ai/promoted-from"] == "staging"
    assert notes["qpa.ai/promoted-report"] == "s3://qpa/releases/planner/abc/report.json"
    kustomization = yaml.safe_load((prod / "kustomization.yaml").read_text())
    assert kustomization["patches"] == [{"path": "harnessrelease-planner.yaml"}]
    assert kustomization["resources"] == ["../../base"] and kustomization["namespace"] == "prod"

    message = head_message(gitops)
    assert message.startswith("Promote planner to prod: Harness harness-v4, model s3://qpa/")
    assert "overall 85.0% (+5.0 points vs stable)" in message
    assert "memory 90.0% (+10.0 points vs stable)" in message
    assert "Report: s3://qpa/releases/planner/abc/report.json" in message
    r = Repo(str(gitops))
    assert r[r.head()].author == AUTHOR.encode()
    status = porcelain.status(str(gitops), untracked_files="no")
    assert not any(status.staged.values()) and not status.unstaged  # all of it committed

    # The same promotion again commits nothing.
    count = commits(gitops)
    again = runner.invoke(
        app,
        ["release", "promote", "--repo", str(gitops), "--from", "staging", "--to", "prod",
         "--status-file", str(status_file(tmp_path)), "--json"],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["commit"] is None and commits(gitops) == count


def test_a_release_the_gate_did_not_pass_is_refused_naming_why(
    gitops: Path, tmp_path: Path
) -> None:
    count = commits(gitops)
    result = runner.invoke(
        app,
        ["release", "promote", "--repo", str(gitops), "--from", "staging", "--to", "prod",
         "--status-file", str(status_file(tmp_path, passed=False))],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "not promoted: the gate did not pass" in said(result)
    assert "tool_use: 60.00% vs baseline 80.00%" in said(result)
    assert commits(gitops) == count
    assert not (gitops / "gitops" / "overlays" / "prod" / "harnessrelease-planner.yaml").exists()


def test_refusals_name_the_file_or_the_reason(gitops: Path, tmp_path: Path) -> None:
    promotion = promotable(HarnessRelease.model_validate(judged_release()))
    with pytest.raises(PromotionError, match="is not a git repository"):
        promote(tmp_path, promotion, source="staging", target="prod")
    with pytest.raises(PromotionError, match="no overlay for 'qa'"):
        promote(gitops, promotion, source="qa", target="prod")
    with pytest.raises(PromotionError, match="are both 'prod'"):
        promote(gitops, promotion, source="prod", target="prod")

    # Staging's overlay pins another version than the one its cluster passed.
    staging = gitops / "gitops" / "overlays" / "staging"
    listed = (staging / "kustomization.yaml").read_text()
    write(staging / "kustomization.yaml", listed + "patches:\n- path: pins.yaml\n")
    write(
        staging / "pins.yaml",
        {"kind": "HarnessRelease", "metadata": {"name": "planner"},
         "spec": {"harness": {"version": "harness-v2"}, "model": {"uri": "s3://x/"}}},
    )  # fmt: skip
    with pytest.raises(PromotionError, match=r"pins\.yaml declares Harness harness-v2 and model"):
        promote(gitops, promotion, source="staging", target="prod")
    write(staging / "kustomization.yaml", listed)

    # Uncommitted edits of the files it writes are never overwritten.
    prod = gitops / "gitops" / "overlays" / "prod" / "kustomization.yaml"
    prod.write_text(prod.read_text() + "commonLabels: {team: a}\n")
    with pytest.raises(PromotionError, match="uncommitted changes in gitops/overlays/prod/kust"):
        promote(gitops, promotion, source="staging", target="prod", author=AUTHOR)

    bad = tmp_path / "broken.yaml"
    bad.write_text("kind: TaskBatch\n")
    result = runner.invoke(
        app, ["release", "promote", "--repo", str(gitops), "--from", "staging", "--to", "prod",
              "--status-file", str(bad)],
    )  # fmt: skip
    assert result.exit_code == 2 and "kind is 'TaskBatch', not HarnessRelease" in said(result)


def test_a_new_environment_gets_an_overlay_on_base_and_the_commit_is_pushed(
    gitops: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote.git"
    porcelain.init(str(remote), bare=True)
    promotion = promotable(HarnessRelease.model_validate(judged_release()))
    done = promote(
        gitops, promotion, source="staging", target="canary-eu", author=AUTHOR, push=str(remote)
    )
    assert done.commit is not None and done.pushed == str(remote)
    overlay = gitops / "gitops" / "overlays" / "canary-eu"
    assert yaml.safe_load((overlay / "kustomization.yaml").read_text()) == {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../base"],
        "patches": [{"path": "harnessrelease-planner.yaml"}],
    }
    branch = porcelain.active_branch(str(gitops))
    assert Repo(str(remote)).refs[b"refs/heads/" + branch] == done.commit.encode()


def test_the_release_is_read_from_the_cluster(
    kube_api: Any, kube_config: Path, gitops: Path
) -> None:
    body = judged_release()
    body["metadata"] = {"name": "planner", "namespace": "default"}
    status = body.pop("status")
    kube_api.create(body)
    kube_api.patch_status("qhr", "default", "planner", status)
    result = runner.invoke(
        app,
        ["release", "promote", "--repo", str(gitops), "--from", "staging", "--to", "prod",
         "--kubeconfig", str(kube_config), "--author", AUTHOR, "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["release"] == "planner" and out["commit"]
    missing = runner.invoke(
        app,
        ["release", "promote", "--repo", str(gitops), "--from", "staging", "--to", "prod",
         "--kubeconfig", str(kube_config), "--release", "nope"],
    )  # fmt: skip
    assert missing.exit_code == 2 and "no HarnessRelease 'nope'" in said(missing)


def test_an_existing_overlay_patch_is_updated_in_place(gitops: Path, tmp_path: Path) -> None:
    prod = gitops / "gitops" / "overlays" / "prod"
    kept = {
        "apiVersion": "qpa.ai/v1alpha1",
        "kind": "HarnessRelease",
        "metadata": {"name": "planner"},
        "spec": {
            "model": {"uri": "s3://qpa/models/a/", "gpus": 4},
            "harness": {"image": "ghcr.io/qpa-ai/qpa-harness:0.0.9", "version": "harness-v3"},
            "gate": {"minOverall": 0.8},
        },
    }
    write(prod / "harnessrelease.yaml", kept)
    write(
        prod / "kustomization.yaml",
        {"resources": ["../../base"], "patches": [{"path": "harnessrelease.yaml"}]},
    )
    porcelain.add(
        str(gitops), [str(prod / "harnessrelease.yaml"), str(prod / "kustomization.yaml")]
    )
    porcelain.commit(str(gitops), message=b"prod pins v3", author=AUTHOR.encode())
    promotion = promotable(HarnessRelease.model_validate(judged_release()))
    done = promote(gitops, promotion, source="staging", target="prod", author=AUTHOR)
    assert done.patch == (prod / "harnessrelease.yaml").resolve()
    assert not (prod / "harnessrelease-planner.yaml").exists()
    patch = yaml.safe_load(done.patch.read_text())
    assert patch["spec"]["gate"] == {"minOverall": 0.8}  # the environment's own settings stay
    assert patch["spec"]["model"]["gpus"] == 4
    assert patch["spec"]["model"]["uri"] == "s3://qpa/models/b/"
    assert patch["spec"]["harness"]["image"] == "ghcr.io/qpa-ai/qpa-harness:0.1.0"
    assert yaml.safe_load((prod / "kustomization.yaml").read_text())["patches"] == [
        {"path": "harnessrelease.yaml"}
    ]
    # prod's overlay now pins v4: a release that passed with another Harness is refused.
    other = promotion.version.harness.model_copy(update={"version": "harness-v9"})
    odd = promotion.model_copy(
        update={"version": promotion.version.model_copy(update={"harness": other})}
    )
    with pytest.raises(PromotionError, match=r"prod/harnessrelease\.yaml declares Harness"):
        promote(gitops, odd, source="prod", target="staging")


def test_a_version_served_with_the_operators_image_is_pinned_to_it(
    gitops: Path, tmp_path: Path
) -> None:
    """A spec without `harness.image` ran the operator's default: the overlay names it."""
    promotion = promotable(HarnessRelease.model_validate(judged_release()))
    version = promotion.version
    bare = version.model_copy(
        update={
            "harness": version.harness.model_copy(update={"image": None}),
            "harness_image": "registry.example/qpa-harness:7",
        }
    )
    promotion = promotion.model_copy(update={"version": bare})
    done = promote(gitops, promotion, source="staging", target="prod", author=AUTHOR)
    patch = yaml.safe_load(done.patch.read_text())
    assert patch["spec"]["harness"]["image"] == "registry.example/qpa-harness:7"
    assert "Harness image registry.example/qpa-harness:7" in head_message(gitops)
