"""The scheduler's placement policy: pure functions from a snapshot to decisions, no I/O.

Two generations live here while the service is being moved over:

- ``first_fit`` (legacy, what the service calls today) with its own types ``NodeState``,
  ``QueuedJob``, ``Snapshot``, ``Placement``, ``Waiting``, ``Decisions`` -- re-exported here
  unchanged so ``scheduling.py`` and ``repository.py`` keep working.
- ``schedule(snapshot, config)`` (quotas, cohorts, priorities, preemption, gangs, backfill,
  fair share, explanations), ``PolicyState`` + ``decide_arrival`` (the arrival fast path) and
  ``decay_usage``, over the types of ``services.scheduler.policy.model``. Import those types
  from ``policy.model``: several share a name with the legacy ones (``Snapshot``,
  ``Placement``, ``Decisions``).

Modules, one job each: ``model`` (types), ``quota`` (nominal quota, cohorts, borrowing and
lending), ``packing`` (gang shapes, best-fit placement, topology), ``backfill`` (release
times, reservations, estimates), ``fairshare`` (decayed usage, ordering, ageing),
``preemption`` (victims), ``explain`` and ``reasons`` (explanations), ``engine`` (the pass),
``incremental`` (a kept pass brought up to date event by event, equal to a full pass).
"""

from trainyard_platform.services.scheduler.policy.engine import (
    PolicyState,
    decide_arrival,
    schedule,
)
from trainyard_platform.services.scheduler.policy.fairshare import decay_usage
from trainyard_platform.services.scheduler.policy.first_fit import (
    Decisions,
    NodeState,
    Placement,
    QueuedJob,
    Snapshot,
    Waiting,
    first_fit,
    queue_order,
)

__all__ = [
    "Decisions",
    "NodeState",
    "Placement",
    "PolicyState",
    "QueuedJob",
    "Snapshot",
    "Waiting",
    "decay_usage",
    "decide_arrival",
    "first_fit",
    "queue_order",
    "schedule",
]
