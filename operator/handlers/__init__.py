"""kopf handlers, one module per kind; importing this package registers all of them.

Each kind's module has the same shape: `reconcile(obj, views, reason)` (create or adopt every
child, then write the status), the kopf change handlers calling it on create/update/resume, and
event handlers on the children (Jobs, Deployments, DaemonSets, InferenceServices, pods, Leases)
that refresh the owner's status. `common` holds the shared machinery, `indexes` the in-memory
views of everything watched.
"""

from qpa_operator.handlers import (
    common,
    devicepool,
    harnessrelease,
    indexes,
    rolloutpool,
    taskbatch,
    trainingrun,
)

__all__ = [
    "common",
    "devicepool",
    "harnessrelease",
    "indexes",
    "rolloutpool",
    "taskbatch",
    "trainingrun",
]
