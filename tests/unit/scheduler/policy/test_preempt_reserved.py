"""No preemption for GPUs a job decided earlier in the pass has reserved.

Victims used to be chosen for the waiting job's gang shape on the GPUs they free, without
looking at the reservations of jobs decided before it. When those GPUs were reserved and
the waiting job's declared runtime would delay that reservation, it could not start on them
once its victims had left; a victim short enough for backfill started again there and was
preempted again once its protection was over (seen on the gangs-over-quota stress trace:
one 2-GPU job preempted three times in 30 minutes for the same job).

The scenario: one 4-GPU node. ``pinned`` (queue c, not preemptible) holds 2 GPUs for 45 more
minutes; ``short`` (queue a, low priority, 30 min declared) holds the other 2. ``big``
(queue b, 4 GPUs) is decided first (queue a has used more lately) and reserves the node from
``pinned``'s end. ``high`` (queue a, 2 GPUs for 50 minutes) could preempt ``short``, but would
then run across ``big``'s start.
"""

from __future__ import annotations

from dataclasses import replace

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import (
    Decisions,
    PendingJob,
    PolicyConfig,
    RunningJob,
)
from trainyard_platform.services.scheduler.policy.preemption import requeued

from .builders import HOUR, NOW, node, pending, queue, running, snap

QUEUES = (queue("a", nominal=4), queue("b", nominal=4), queue("c", nominal=2))
GRACE = PolicyConfig().grace_s
USAGE = {"team-a": 10_000 * HOUR}
"""Queue a has used more than b lately: ``big`` goes before ``high`` in every pass."""
NODES = (node("n1", gpus=4),)
BIG = pending("big", "b", gpus=4, priority="normal", at=NOW - HOUR)
HIGH = pending("high", "a", gpus=2, priority="high", at=NOW - 600, runtime=3000)
PINNED = running(
    "pinned", "c", {"n1": 2}, priority="pinned", started=NOW - HOUR, runtime=HOUR + 2700
)
SHORT = replace(
    running("short", "a", {"n1": 2}, priority="low", started=NOW - 300, runtime=1800),
    submitted_at=NOW - 310,
    seq=1,
)


def _pass(now: float, pend: tuple[PendingJob, ...], run: tuple[RunningJob, ...]) -> Decisions:
    return schedule(snap(NODES, QUEUES, pend, run, usage=USAGE, now=now))


def test_no_victim_for_gpus_reserved_for_a_job_ahead() -> None:
    d = _pass(NOW, (BIG, HIGH), (PINNED, SHORT))
    assert d.preemptions == ()
    assert d.placements == ()
    # The explanation says what stops it: the GPUs it could free are reserved for ``big``.
    high = d.explanations["high"]
    # (named by its team: ``big`` is another team's job)
    assert high.blocking == "team-b"
    assert "preempting would free are reserved for a team-b job" in high.reason
    assert "freeing" not in high.reason


def test_a_shorter_job_may_still_preempt_for_them() -> None:
    """One that ends before the reservation starts delays nothing: it still preempts."""
    brief = replace(HIGH, declared_runtime_s=600)
    d = _pass(NOW, (BIG, brief), (PINNED, SHORT))
    assert [(p.job_id, p.for_job_id) for p in d.preemptions] == [("short", "high")]


def test_the_victim_is_not_preempted_again_and_again() -> None:
    """A short history: each pass's preemptions end after the grace period, the victim is
    re-queued and may start again. Before the rule ``short`` was preempted at once, started
    again when it had left (backfill: it ends before ``big``'s reservation) and was
    preempted again once its protection was over; ``high`` never started on its GPUs."""
    pend: tuple[PendingJob, ...] = (BIG, HIGH)
    run: tuple[RunningJob, ...] = (PINNED, SHORT)
    preempted = 0
    now = NOW
    for _ in range(6):
        d = _pass(now, pend, run)
        for p in d.preemptions:
            preempted += 1
            victim = next(r for r in run if r.job_id == p.job_id)
            assert victim.submitted_at is not None
            run = tuple(r for r in run if r.job_id != p.job_id)
            pend = (*pend, requeued(victim, victim.submitted_at))
        for placement in d.placements:
            job = next(j for j in pend if j.job_id == placement.job_id)
            pend = tuple(j for j in pend if j.job_id != job.job_id)
            layout = {n: tuple(i) for n, i in placement.gpus.items()}
            started = RunningJob(
                job.job_id, job.queue, job.flavor, job.gpus, job.priority, now,
                job.declared_runtime_s, layout, preemptions=preempted if job.job_id == "short"
                else 0, submitted_at=job.submitted_at, seq=job.seq,
            )  # fmt: skip
            run = (*run, started)
        now += GRACE
    assert preempted == 0


def test_no_reclaim_for_gpus_reserved_for_a_job_ahead_and_the_reason_says_so() -> None:
    """The same for reclaim: queue a (cohort co) lends its 2 GPUs to queue l, whose job
    holds them; taking them back would give ``high`` GPUs reserved for ``big``. It is not
    told "reclaim expected in ~5 min" (its victim would not be taken), but what stops it."""
    queues = (
        queue("a", nominal=2, cohort="co"),
        queue("l", nominal=0, cohort="co"),
        queue("b", nominal=4),
        queue("c", nominal=2),
    )
    lent = replace(SHORT, job_id="lent", queue="l", priority="normal")
    d = schedule(snap(NODES, queues, (BIG, HIGH), (PINNED, lent), usage=USAGE))
    assert d.preemptions == ()
    high = d.explanations["high"]
    assert "reclaim expected" not in high.reason
    assert "preempting would free are reserved for a team-b job" in high.reason
    # Without ``big`` in line the same reclaim is made.
    d = schedule(snap(NODES, queues, (HIGH,), (PINNED, lent), usage=USAGE))
    assert [(p.job_id, p.kind) for p in d.preemptions] == [("lent", "reclaim")]
