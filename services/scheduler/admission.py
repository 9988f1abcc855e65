"""Admission: whether a job the scheduler takes in can ever run here, judged once, on arrival.

Contract:
- ``refusal(spec, facts)`` is pure: None when the job may wait for GPUs, else the reason a
  user reads (every problem found, ``; ``-separated, each with what to ask for instead).
- A job is refused when the cluster's *configuration* can never give what it asks, however
  many nodes join:
  1. its priority class does not exist (operators define the classes);
  2. its team has a queue an operator defined, and that queue can never hold as many GPUs of
     the flavor: its nominal quota plus what it may borrow from its cohort
     (``QuotaBook.ceiling``; a flavor missing from the quotas is a quota of 0), or only its
     nominal quota for a job of a class that is not preemptible, which never borrows;
  3. the gang rules (``packing.job_shapes``: one node, or equal parts on at most twice the
     fewest nodes) cannot lay the job out on nodes of the size of the largest node of the
     flavor the scheduler has ever seen, ready or lost (more nodes of that size never help;
     a lost node counts so that a node restarting does not get jobs refused);
  4. it names a container ``image``: no runner runs one (``runner.launch.cannot_run``), so
     every grant of it would end in the runner's refusal, a platform failure counted
     against that node's health (``cordon``).
- A job is *not* refused when capacity is all it lacks; it waits, and its ``job.pending``
  says why (the policy's reasons, unchanged): a flavor no node has (yet: a node of it may
  join; the submission API already refuses a flavor it is not configured with), more GPUs
  than the flavor's ready nodes have together, a team's implicit queue (its quota is the
  cluster).
- ``load_facts`` reads what ``refusal`` needs in one query, two for a team with a queue an
  operator defined.
- A job is refused too when its team already has ``Tuning.max_waiting_jobs`` jobs waiting
  (``too_many_waiting``): not the configuration's doing but a bound on what one team may
  make every scheduling pass weigh; the handlers count a team's waiting jobs
  (``repository.waiting_jobs``).
- ``refused`` is the event that ends a refused job: ``job.failed`` with ``failure_kind``
  ``rejected``, no allocation (``allocation_id`` and ``node_id`` empty, epoch 0); the job is
  never inserted into the scheduler's tables and never holds GPUs, so nothing is billed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from trainyard_platform.services.scheduler.convert import queues_from_rows
from trainyard_platform.services.scheduler.policy.explain import gpus as gpus_text
from trainyard_platform.services.scheduler.policy.model import Queue
from trainyard_platform.services.scheduler.policy.packing import job_shapes
from trainyard_platform.services.scheduler.policy.quota import QuotaBook
from trainyard_platform.shared.events.payloads import MAX_JOB_GPUS, JobFailed, JobSpec

REFUSED_PREFIX = "refused: "
"""Every refused job's ``job.failed`` reason starts so."""


@dataclass(frozen=True)
class Facts:
    """What admission knows of the cluster's configuration for one job."""

    classes: tuple[str, ...]
    """The priority classes that exist."""
    unpreemptible: tuple[str, ...] = ()
    """Those of them that are not preemptible (their jobs never borrow quota)."""
    queue: Queue | None = None
    """The team's queue if an operator defined it; None for an implicit queue (or none yet)."""
    cohort: tuple[Queue, ...] = ()
    """The other queues of ``queue``'s cohort (what it may borrow comes from them)."""
    largest_node: int = 0
    """GPUs of the largest node of the job's flavor ever seen (ready or lost); 0: none."""


def refusal(spec: JobSpec, facts: Facts) -> str | None:
    """Why the cluster's configuration can never run ``spec``, or None (see the module)."""
    reasons = [
        reason
        for reason in (
            _unknown_class(spec.priority, facts.classes),
            _over_ceiling(spec, facts),
            _no_layout(spec, facts.largest_node),
            _in_an_image(spec),
        )
        if reason is not None
    ]
    return "; ".join(reasons) or None


def _in_an_image(spec: JobSpec) -> str | None:
    if spec.image is None:
        return None
    return (
        f"asks to run in the container image {spec.image!r}, and no runner of this platform "
        "runs container images (the container executor is not wired into the runner); leave "
        "image out and name the job's requirements instead"
    )


def _unknown_class(priority: str, classes: Sequence[str]) -> str | None:
    if priority in classes:
        return None
    existing = ", ".join(sorted(classes)) or "none (ask an operator to define one)"
    return f"priority class '{priority}' does not exist; existing: {existing}"


def _over_ceiling(spec: JobSpec, facts: Facts) -> str | None:
    queue = facts.queue
    if queue is None:
        return None
    book = QuotaBook((queue, *(q for q in facts.cohort if q.name != queue.name)))
    flavor, name = spec.gpu_flavor, queue.name
    borrows = spec.priority not in facts.unpreemptible
    ceiling = book.ceiling(name, flavor, borrows)
    if spec.gpus <= ceiling:
        return None
    nominal = book.nominal(name, flavor)
    if not borrows and book.ceiling(name, flavor) > ceiling:
        instead = f"ask for at most {nominal} or " if nominal > 0 else ""
        return (
            f"asks for {gpus_text(spec.gpus, flavor)} but priority class {spec.priority} is "
            f"not preemptible, so its jobs never borrow, and queue {name} holds at most its "
            f"nominal quota {nominal}; {instead}use a preemptible class"
        )
    if ceiling == 0:
        lends = f" and its cohort {queue.cohort} lends none" if queue.cohort else ""
        return (
            f"asks for {gpus_text(spec.gpus, flavor)} but queue {name} has no {flavor} "
            f"quota{lends}; ask an operator for {flavor} quota"
        )
    borrowed = ceiling - nominal
    parts = f"its nominal quota {nominal}"
    if borrowed > 0:
        parts += f" plus {borrowed} it may borrow from cohort {queue.cohort}"
    return (
        f"asks for {gpus_text(spec.gpus, flavor)} but queue {name} can never hold more than "
        f"{ceiling} ({parts}); ask for at most {ceiling}"
    )


def _no_layout(spec: JobSpec, largest_node: int) -> str | None:
    if largest_node < 1 or job_shapes(spec.gpus, None, largest_node):
        return None
    flavor = spec.gpu_flavor
    fits = [n for n in range(1, MAX_JOB_GPUS + 1) if job_shapes(n, None, largest_node)]
    below = [n for n in fits if n < spec.gpus]
    above = [n for n in fits if n > spec.gpus]
    asks = " or ".join(str(n) for n in (below[-1:] + above[:1]))
    hint = f"; ask for {asks} GPUs" if asks else ""
    return (
        f"asks for {gpus_text(spec.gpus, flavor)}, which cannot be laid out on {flavor} nodes "
        f"of at most {largest_node} GPUs (a job larger than one node takes equal parts on at "
        f"most twice the fewest nodes it needs){hint}"
    )


# --- the service's side --------------------------------------------------------------------


async def load_facts(conn: asyncpg.Connection, spec: JobSpec) -> Facts:
    """The configuration ``refusal`` judges ``spec`` against, as committed now."""
    row = await conn.fetchrow(
        """SELECT ARRAY(SELECT name FROM priority_classes ORDER BY name) AS classes,
                  ARRAY(SELECT name FROM priority_classes WHERE NOT preemptible
                        ORDER BY name) AS unpreemptible,
                  (SELECT max(gpu_count) FROM nodes
                   WHERE gpu_flavor = $2 AND retired_at IS NULL) AS largest_node,
                  q.name, q.team, q.cohort, q.weight, q.implicit
           FROM (SELECT 1) AS one LEFT JOIN queues q ON q.team = $1""",
        spec.team,
        spec.gpu_flavor,
    )
    assert row is not None  # the outer join always gives one row
    facts = Facts(
        classes=tuple(row["classes"]),
        unpreemptible=tuple(row["unpreemptible"]),
        largest_node=row["largest_node"] or 0,
    )
    if row["name"] is None or row["implicit"]:
        return facts
    rows = await conn.fetch(
        """SELECT q.name, q.team, q.cohort, q.weight, q.implicit, t.queue, t.flavor,
                  t.nominal, t.borrowing_limit, t.lending_limit
           FROM queues q LEFT JOIN quotas t ON t.queue = q.name AND t.flavor = $3
           WHERE q.name = $1 OR q.cohort = $2""",
        row["name"],
        row["cohort"],
        spec.gpu_flavor,
    )
    queues = {q.name: q for q in _queues(rows)}
    own = queues.pop(row["name"])
    return Facts(
        facts.classes, facts.unpreemptible, own, tuple(queues.values()), facts.largest_node
    )


def _queues(rows: Sequence[Mapping[str, Any]]) -> tuple[Queue, ...]:
    quotas = [r for r in rows if r["queue"] is not None]
    return queues_from_rows(rows, quotas, totals={})


def too_many_waiting(team: str, most: int) -> str:
    """Why a job is refused when its team has ``most`` jobs waiting already."""
    return (
        f"team {team} already has {most} jobs waiting, the most a team may have "
        "(TRAINYARD_SCHEDULER_MAX_WAITING_JOBS_PER_TEAM); submit more as these start or end"
    )


def refused(job_id: str, reason: str, now: datetime) -> JobFailed:
    """The scheduler's final word on a job it refused on arrival (see the module)."""
    return JobFailed(
        job_id=job_id,
        allocation_id="",
        node_id="",
        epoch=0,
        finished_at=now,
        exit_code=None,
        reason=f"{REFUSED_PREFIX}{reason}",
        failure_kind="rejected",
    )
