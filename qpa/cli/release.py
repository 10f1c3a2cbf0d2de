"""`qpa release promote`: carry a HarnessRelease that passed its gate to the next environment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qpa.cli import app
from qpa.cli.common import console, die, print_json

release_app = typer.Typer(
    help="Releases of model + Harness versions: GitOps promotion between environments.",
    no_args_is_help=True,
)
app.add_typer(release_app, name="release")

PROMOTE_HELP = (
    "Commit a version that passed the release gate into the next environment's overlay.\n\n"
    "Reads the HarnessRelease (from the cluster with the kubernetes client, or from "
    "--status-file, e.g. the output of `kubectl get hr planner -o yaml`) and refuses unless "
    "condition GatePassed is True for the version its spec names: a rollback, an undecided "
    "gate or a forced promotion are refused with the reason. Then it commits the version into "
    "the GitOps repository at --repo (kustomize):\n\n"
    "\b\n"
    "<root>/base/kustomization.yaml            shared by every environment\n"
    "<root>/overlays/<env>/kustomization.yaml  resources: [../../base], patches: [...]\n"
    "<root>/overlays/<env>/harnessrelease-<release>.yaml\n"
    "                                          the version <env> runs (written here)\n\n"
    "An overlay patch of the release that the kustomization already lists (any file name, e.g. "
    "harnessrelease.yaml) is updated in place, else harnessrelease-<release>.yaml is added. "
    "Only spec.model (uri, runtime, servedModelName), spec.harness (image, version, "
    "configMapRef) and the annotations qpa.ai/promoted-from, -version and -report change; "
    "the commit message names the scores and their deltas against the stable version. The "
    "--from overlay must exist (and pin the same version, when it pins one); a missing --to "
    "overlay is created on <root>/base."
)


@release_app.command("promote", help=PROMOTE_HELP)
def promote_command(
    repo: Annotated[Path, typer.Option("--repo", help="The GitOps git repository.")],
    source: Annotated[str, typer.Option("--from", help="Environment the gate passed in.")],
    target: Annotated[str, typer.Option("--to", help="Environment to promote to.")],
    release: Annotated[
        str | None, typer.Option("--release", help="HarnessRelease name (default: the only one).")
    ] = None,
    status_file: Annotated[
        Path | None,
        typer.Option(
            "--status-file", help="The HarnessRelease as YAML/JSON instead of the cluster."
        ),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Namespace in the cluster.")
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="kubeconfig context.")] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="kubeconfig file.")
    ] = None,
    root: Annotated[
        str, typer.Option("--root", help="Folder of base/ and overlays/ in the repository.")
    ] = "gitops",
    author: Annotated[
        str | None, typer.Option("--author", help="'Name <email>' (default: git config).")
    ] = None,
    push: Annotated[
        str | None, typer.Option("--push", help="Push the branch to this remote URL or path.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    from qpa.release.gitops import PromotionError, promote
    from qpa.release.promotion import NotPromotable, promotable
    from qpa.release.source import ReleaseSourceError, from_cluster, from_file

    try:
        if status_file is not None:
            hr = from_file(status_file, release)
        else:
            hr = from_cluster(release, namespace, context=context, kubeconfig=kubeconfig)
        promotion = promotable(hr)
    except (ReleaseSourceError, NotPromotable) as exc:
        die(f"not promoted: {exc}")
    try:
        done = promote(
            repo, promotion, source=source, target=target, root=root, author=author, push=push
        )
    except PromotionError as exc:
        die(f"not promoted: {exc}")
    if as_json:
        print_json(
            {
                "release": promotion.release,
                "version": promotion.version.id,
                "from": source,
                "to": target,
                "commit": done.commit,
                "patch": str(done.patch),
                "pushed": done.pushed,
            }
        )
        return
    if done.commit is None:
        console.print(
            f"{target} already runs {promotion.version.id} "
            f"(Harness {promotion.version.harness.version}): nothing to commit",
            highlight=False,
        )
        return
    console.print(done.message.rstrip(), highlight=False)
    console.print(
        f"committed {done.commit[:12]}: {done.patch}"
        + (f"; pushed to {done.pushed}" if done.pushed else ""),
        highlight=False,
    )
