"""kopf handlers, one module per kind; importing this package registers all of them.

Each kind's module has the same shape: `reconcile(obj, views, reason)` (create or adopt every
child, then write the status), the kopf change handlers calling it on create/update/resume, and
event handlers on the children (Jobs, Deployments, DaemonSets, InferenceServices, pods, Leases)
that refresh the owner's status. The shared machinery: `runtime` (the API client, retries, the
reconcile wrapper), `views` (reading objects and the kopf indexes), `apply` (create-or-adopt of
children by spec hash), `status` (status writes, phase Events, child events); `indexes`
registers the in-memory views of everything watched.
"""

from qpa_operator.handlers import (
    apply,
    devicepool,
    harnessrelease,
    indexes,
    rolloutpool,
    runtime,
    status,
    taskbatch,
    trainingrun,
    views,
)

__all__ = [
    "apply",
    "devicepool",
    "harnessrelease",
    "indexes",
    "rolloutpool",
    "runtime",
    "status",
    "taskbatch",
    "trainingrun",
    "views",
]
