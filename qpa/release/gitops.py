"""GitOps promotion: commit a version the gate passed into the next environment's overlay.

The repository layout (kustomize; `root` defaults to `gitops`):

    <root>/base/                         shared by every environment
        kustomization.yaml               e.g. resources: [harnessrelease.yaml, ...]
        harnessrelease.yaml
    <root>/overlays/<env>/               one folder per environment (staging, prod, ...)
        kustomization.yaml               resources: [../../base]; patches: [{path: ...}]
        harnessrelease-<release>.yaml    the version this environment runs (written here)

`promote(repo, promotion, source="staging", target="prod")` sets the promoted version in the
target overlay's patch of that HarnessRelease: the file its `kustomization.yaml` already lists
as a patch of it (any name, e.g. `harnessrelease.yaml`), else a new
`overlays/<target>/harnessrelease-<release>.yaml` added to `patches`. Only the version's fields
change (`spec.model.uri/runtime/servedModelName`, `spec.harness.image/version/configMapRef`)
plus the `qpa.ai/promoted-from/-version/-report` annotations; whatever else the environment
patches (its gate, its GPUs) stays. Both files are committed with a message naming the
scores. A GitOps controller (Argo CD, Flux) applying the overlay then starts the same release
in the target environment, where the operator benchmarks and gates it again.

It refuses (`PromotionError`, naming why) when the repository or the source overlay is missing,
the source overlay declares another version than the one promoted there, or the files it writes
have uncommitted changes. Promoting a version the target already runs commits nothing.
Git is driven with dulwich (no git binary).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from dulwich import porcelain
from dulwich.errors import NotGitRepository
from dulwich.repo import Repo

from qpa.api import API_VERSION
from qpa.release.promotion import Promotion, score_lines

OVERLAYS: Final = "overlays"
KUSTOMIZATION: Final = "kustomization.yaml"
ANNOTATION_FROM: Final = "qpa.ai/promoted-from"
ANNOTATION_VERSION: Final = "qpa.ai/promoted-version"
ANNOTATION_REPORT: Final = "qpa.ai/promoted-report"


class PromotionError(RuntimeError):
    """The promotion cannot be written or committed (names the file or the reason)."""


@dataclass(frozen=True)
class Promoted:
    """What `promote` did: the files written and the commit (None: already there)."""

    commit: str | None
    patch: Path
    kustomization: Path
    message: str
    pushed: str | None = None


def overlay(repo: Path, env: str, root: str = "gitops") -> Path:
    return repo / root / OVERLAYS / env


def patch_name(release: str) -> str:
    return f"harnessrelease-{release}.yaml"


def render_patch(
    promotion: Promotion, source: str, existing: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The HarnessRelease patch naming the promoted version, merged into `existing`.

    Only the version's fields and the `qpa.ai/promoted-*` annotations are set: whatever else an
    environment's patch holds (its gate, its GPUs) stays as it is.
    """
    version = promotion.version
    patch: dict[str, Any] = dict(existing or {})
    patch.setdefault("apiVersion", API_VERSION)
    patch.setdefault("kind", "HarnessRelease")
    meta = dict(patch.get("metadata") or {})
    meta["name"] = promotion.release
    annotations = dict(meta.get("annotations") or {})
    annotations.update({ANNOTATION_FROM: source, ANNOTATION_VERSION: version.id})
    if version.report_uri:
        annotations[ANNOTATION_REPORT] = version.report_uri
    else:
        annotations.pop(ANNOTATION_REPORT, None)
    meta["annotations"] = annotations
    patch["metadata"] = meta
    spec = dict(patch.get("spec") or {})
    model = dict(spec.get("model") or {})
    model.update(
        uri=version.model.uri,
        runtime=version.model.runtime,
        servedModelName=version.model.served_model_name,
    )
    harness = dict(spec.get("harness") or {})
    # the image the version was served with (the operator's default when the spec named none)
    harness.update(
        image=version.harness.image or version.harness_image, version=version.harness.version
    )
    if version.harness.config_map_ref is not None:
        harness["configMapRef"] = version.harness.config_map_ref.to_k8s()
    else:
        harness.pop("configMapRef", None)
    spec.update(model=model, harness=harness)
    patch["spec"] = spec
    return patch


def commit_message(promotion: Promotion, source: str, target: str) -> str:
    version = promotion.version
    lines = [
        f"Promote {promotion.release} to {target}: Harness {version.harness.version}, "
        f"model {version.model.uri}",
        "",
        f"The release gate passed version {version.id} in {source} (phase {promotion.phase}):",
        *(f"  {line}" for line in score_lines(promotion)),
    ]
    if version.report_uri:
        lines += ["", f"Report: {version.report_uri}"]
    image = version.harness.image or version.harness_image
    lines += ["", f"Harness image {image}; written by `qpa release promote`."]
    return "\n".join(lines) + "\n"


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PromotionError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PromotionError(f"{path}: not YAML: {exc}") from None


def _patch_files(kustomization: dict[str, Any]) -> list[str]:
    """The files a Kustomization lists as patches (`patches[].path`, `patchesStrategicMerge`)."""
    files = []
    for entry in kustomization.get("patches") or []:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str):
            files.append(path)
    files += [p for p in kustomization.get("patchesStrategicMerge") or [] if isinstance(p, str)]
    return files


def find_patch(folder: Path, release: str) -> Path | None:
    """The overlay's patch of HarnessRelease `release`, whatever its file is called."""
    path = folder / KUSTOMIZATION
    if not path.is_file():
        return None
    loaded = _load_yaml(path)
    if not isinstance(loaded, dict):
        raise PromotionError(f"{path}: expected a Kustomization mapping")
    for name in _patch_files(loaded):
        candidate = (folder / name).resolve()
        if not candidate.is_file() or not candidate.is_relative_to(folder.resolve()):
            continue
        for doc in yaml.safe_load_all(candidate.read_text(encoding="utf-8")):
            if (
                isinstance(doc, dict)
                and doc.get("kind") == "HarnessRelease"
                and (doc.get("metadata") or {}).get("name") == release
            ):
                return candidate
    return None


def check_source(repo: Path, root: str, source: str, promotion: Promotion) -> None:
    """The source overlay must exist and, if it pins this release, pin the promoted version."""
    folder = overlay(repo, source, root)
    if not (folder / KUSTOMIZATION).is_file():
        raise PromotionError(
            f"no overlay for {source!r}: {folder / KUSTOMIZATION} is missing "
            f"(layout: {root}/{OVERLAYS}/<env>/{KUSTOMIZATION})"
        )
    pinned = find_patch(folder, promotion.release)
    if pinned is None:
        return
    data = _load_yaml(pinned)
    spec = ((data or {}).get("spec") or {}) if isinstance(data, dict) else {}
    declared = ((spec.get("harness") or {}).get("version"), (spec.get("model") or {}).get("uri"))
    version = promotion.version
    if declared != (version.harness.version, version.model.uri):
        raise PromotionError(
            f"{pinned} declares Harness {declared[0]} and model {declared[1]}, but the release "
            f"in {source} passed the gate with Harness {version.harness.version} and model "
            f"{version.model.uri}: the cluster does not run what {source}'s overlay says"
        )


def ensure_kustomization(repo: Path, root: str, target: str, patch_file: str) -> Path:
    """The target overlay's kustomization.yaml, listing the patch (created from base if new)."""
    folder = overlay(repo, target, root)
    path = folder / KUSTOMIZATION
    if not path.is_file():
        base = repo / root / "base"
        if not (base / KUSTOMIZATION).is_file():
            raise PromotionError(
                f"no overlay for {target!r} ({path} is missing) and no {base / KUSTOMIZATION} "
                "to build one on"
            )
        folder.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["../../base"],
            "patches": [{"path": patch_file}],
        }
        path.write_text(_dump(data), encoding="utf-8")
        return path
    loaded = _load_yaml(path)
    if not isinstance(loaded, dict):
        raise PromotionError(f"{path}: expected a Kustomization mapping")
    patches = loaded.get("patches") or []
    if not isinstance(patches, list):
        raise PromotionError(f"{path}: field 'patches' must be a list")
    if patch_file in _patch_files(loaded):
        return path
    loaded["patches"] = [*patches, {"path": patch_file}]
    path.write_text(_dump(loaded), encoding="utf-8")
    return path


def _open(repo: Path) -> Repo:
    try:
        return Repo(str(repo))
    except NotGitRepository:
        raise PromotionError(f"{repo} is not a git repository") from None


def _dirty(repo: Repo, paths: list[str]) -> list[str]:
    """Those of `paths` (relative, '/'-separated) with staged or unstaged changes."""
    status = porcelain.status(repo, untracked_files="no")
    changed = {
        p.decode() if isinstance(p, bytes) else str(p)
        for group in (status.staged.values(), [status.unstaged])
        for items in group
        for p in items
    }
    return [p for p in paths if p in changed]


def promote(
    repo: str | Path,
    promotion: Promotion,
    *,
    source: str,
    target: str,
    root: str = "gitops",
    author: str | None = None,
    push: str | None = None,
) -> Promoted:
    """Write the target overlay's patch and commit it (and push it, with `push`)."""
    if source == target:
        raise PromotionError(f"--from and --to are both {source!r}")
    for env in (source, target):
        if not env or "/" in env or env.startswith("."):
            raise PromotionError(f"environment {env!r} is not a folder name")
    path = Path(repo).resolve()
    git = _open(path)
    check_source(path, root, source, promotion)
    folder = overlay(path, target, root)
    existing = find_patch(folder, promotion.release)
    patch_path = existing or folder / patch_name(promotion.release)
    patch_file = str(patch_path.relative_to(folder.resolve()) if existing else patch_path.name)
    kustomization = folder / KUSTOMIZATION
    relative = [str(p.relative_to(path)) for p in (patch_path, kustomization)]
    dirty = _dirty(git, relative)
    if dirty:
        raise PromotionError(
            f"uncommitted changes in {', '.join(dirty)}: commit or discard them first"
        )
    ensure_kustomization(path, root, target, patch_file)
    current = _load_yaml(patch_path) if existing else None
    merged = render_patch(promotion, source, current if isinstance(current, dict) else None)
    patch_path.write_text(_dump(merged), encoding="utf-8")
    message = commit_message(promotion, source, target)
    porcelain.add(git, [str(patch_path), str(kustomization)])
    if not _dirty(git, relative):
        return Promoted(None, patch_path, kustomization, message)
    identity = author.encode() if author else None
    sha = porcelain.commit(git, message=message.encode(), author=identity, committer=identity)
    pushed = None
    if push is not None:
        branch = porcelain.active_branch(git)
        errors = io.BytesIO()
        try:
            porcelain.push(
                git, push, [b"refs/heads/" + branch], outstream=io.BytesIO(), errstream=errors
            )
        except Exception as exc:  # dulwich raises per transport (HangupException, GitProtocolError)
            detail = errors.getvalue().decode(errors="replace").strip()
            raise PromotionError(
                f"committed {sha.decode()[:12]} but could not push to {push}: {exc} {detail}"
            ) from None
        pushed = push
    return Promoted(sha.decode(), patch_path, kustomization, message, pushed)
