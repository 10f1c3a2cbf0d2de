"""Pure builders: a parsed custom resource (and `Defaults`) in, Kubernetes manifests out.

One module per kind (`taskbatch`, `rolloutpool`, `devicepool`, `trainingrun`,
`harnessrelease`), each with `children(...)` (the manifests to create, in order) and a
`*_status(...)` function turning what the children report into the resource's status; `common`
holds names, labels, owner references, security contexts and secret wiring; `netpol` the
egress NetworkPolicies of the pods that run episodes. Nothing here talks to the API server,
reads the clock or the environment: handlers pass those in.
"""

from qpa_operator.builders import (
    common,
    devicepool,
    harnessrelease,
    netpol,
    rolloutpool,
    taskbatch,
    trainingrun,
)
from qpa_operator.builders.common import Defaults

__all__ = [
    "Defaults",
    "common",
    "devicepool",
    "harnessrelease",
    "netpol",
    "rolloutpool",
    "taskbatch",
    "trainingrun",
]
