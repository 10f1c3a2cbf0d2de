"""Releases of model + Harness versions: the gate's verdict and GitOps promotion.

- `qpa.release.verdict`: a candidate's `report.json` read from the store (`qpa.store`) and
  judged by the release gate (`qpa.bench.gate`) against the stable version's report; the
  HarnessRelease operator calls it, and it fails closed;
- `qpa.release.promotion`: what a HarnessRelease's status allows to promote (the gate must
  have passed for the version it names);
- `qpa.release.source`: a HarnessRelease from the cluster (kubernetes client) or a file;
- `qpa.release.gitops`: the promoted version committed into the next environment's kustomize
  overlay (`overlays/<env>/`) of a GitOps repository, with dulwich.

Imports qpa.api, qpa.bench (the gate and the report model) and qpa.store, never the
environments, the Harness or training. Submodules are imported on use (the operator needs only
the verdict, not git).
"""
