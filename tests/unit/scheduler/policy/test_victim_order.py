"""A waiting job preempts only jobs it would stand before once they are re-queued
(docs/scheduling.md, "When a job may be preempted"): a re-queued victim keeps its submit
time, so otherwise it could be decided first in the next pass, start again on the GPUs it
left, and be preempted again once protected no more.

Within a queue the order is the queue's (ageing, priority level, size); across a cohort a
reclaimed job re-queued borrows again and goes after every job within its nominal quota,
except when it was all its queue held: then it is in the first tier, ordered by fair share.
"""

from __future__ import annotations

from dataclasses import replace

from trainyard_platform.services.scheduler.policy import schedule
from trainyard_platform.services.scheduler.policy.model import (
    PendingJob,
    PolicyConfig,
    RunningJob,
    Snapshot,
)

from .builders import HOUR, NOW, node, pending, queue, running, snap

CONFIG = PolicyConfig()


def requeued(job: RunningJob) -> PendingJob:
    assert job.submitted_at is not None
    return pending(job.job_id, job.queue, job.gpus, priority=job.priority,
                   at=job.submitted_at, runtime=job.declared_runtime_s,
                   seq=job.seq)  # fmt: skip


def notices_ended(before: Snapshot, victim: RunningJob, waiting: PendingJob) -> Snapshot:
    """The cluster once ``victim`` has left (the end of its notice): it waits again."""
    nodes = tuple(replace(n, used={}) for n in before.nodes)
    return replace(
        before, now=before.now + CONFIG.grace_s, nodes=nodes, pending=(waiting, requeued(victim)),
        running=(),
    )  # fmt: skip


# --- reclaim: a gang that was all its queue held --------------------------------------------


def gang(submitted: float) -> RunningJob:
    """Queue b's only job: 6 GPUs, 4 more than b's nominal quota of 2 (the gang larger than
    its quota an idle queue may start), running for 4.5 h (past its 4 h protection)."""
    job = running("g", "b", {"n1": 6}, priority="low", started=NOW - 4.5 * HOUR)
    return replace(job, submitted_at=submitted, seq=1)


def cohort(usage_a: float, usage_b: float, job: RunningJob) -> Snapshot:
    """Queues a (nominal 4) and b (nominal 2) lending to each other; a's job p (4 GPUs,
    within a's nominal) needs the quota b's gang borrows."""
    queues = (queue("a", 4, cohort="c"), queue("b", 2, cohort="c"))
    p = pending("p", "a", 4, priority="low", at=NOW - 60)
    return snap((node("n1", 8),), queues, (p,), (job,), {"team-a": usage_a, "team-b": usage_b})


def test_reclaim_spares_a_gang_that_would_start_again_first() -> None:
    """Team a used much more than team b lately: once re-queued, b's gang (in the first tier,
    b holding nothing then) stands before a's job. Reclaimed, it would start again at once
    and a's job would wait anyway; so a's job waits for its end without preempting."""
    heavy = 500.0 * 8 * 24 * HOUR  # GPU-seconds: a's team kept the cluster busy for weeks
    before = cohort(heavy, 0.0, gang(NOW - 5 * HOUR))
    # What reclaiming it would lead to: the gang is decided first and starts again.
    after = notices_ended(before, before.running[0], before.pending[0])
    assert [p.job_id for p in schedule(after, CONFIG).placements] == ["g"]
    decisions = schedule(before, CONFIG)
    assert decisions.preemptions == (), "a's job reclaimed a gang that would start first again"
    assert "p" in decisions.explanations


def test_a_job_that_may_not_reclaim_a_gang_expects_its_declared_end() -> None:
    """The same spared gang: a's job is told it starts when the gang ends (in 5.5 h), not
    when the gang could be reclaimed (its protection over: at once, then the grace)."""
    heavy = 500.0 * 8 * 24 * HOUR
    before = cohort(heavy, 0.0, gang(NOW - 5 * HOUR))
    g = before.running[0]
    explained = schedule(before, CONFIG).explanations["p"]
    assert explained.estimated_start == g.started_at + g.declared_runtime_s
    assert explained.reason.endswith("it returns as their jobs end, expected in ~5.5 h")
    # b's team the heavy user: the gang may be reclaimed, which the estimate says.
    taken = schedule(cohort(0.0, heavy, gang(NOW - 5 * HOUR)), CONFIG)
    assert taken.explanations["p"].estimated_start == NOW + CONFIG.grace_s


def test_jobs_of_one_request_expect_what_each_may_reclaim() -> None:
    """Two of a's jobs of the same size wait for b's gang, still protected: the one
    submitted 2,000 h ago stands before it re-queued (it may reclaim it once protected: 3 h
    and the grace), the other does not (it waits for the gang's declared end, 9 h). The
    explanation of one request is not reused for the other, in either order."""
    heavy = 500.0 * 8 * 24 * HOUR
    queues = (queue("a", 4, cohort="c"), queue("b", 2, cohort="c"))
    g = replace(running("g", "b", {"n1": 6}, priority="low", started=NOW - HOUR),
                submitted_at=NOW - 2 * HOUR, seq=1)  # fmt: skip
    for ages in ((2000, 1), (1, 2000)):
        jobs = tuple(
            pending(f"p{i}", "a", 4, priority="low", at=NOW - age * HOUR, seq=10 + i)
            for i, age in enumerate(ages)
        )
        before = snap((node("n1", 8),), queues, jobs, (g,), {"team-a": heavy, "team-b": 0.0})
        explained = schedule(before, CONFIG).explanations
        old, new = (f"p{ages.index(age)}" for age in (2000, 1))
        assert explained[old].estimated_start == NOW + 3 * HOUR + CONFIG.grace_s, ages
        assert explained[new].estimated_start == g.started_at + g.declared_runtime_s, ages


def test_reclaim_takes_a_gang_that_would_wait_behind_the_job() -> None:
    """The same cluster with b's team the heavy user: re-queued, the gang stands after a's
    job, which reclaims it and starts once it has left; the gang waits."""
    heavy = 500.0 * 8 * 24 * HOUR
    before = cohort(0.0, heavy, gang(NOW - 5 * HOUR))
    decisions = schedule(before, CONFIG)
    assert [(p.job_id, p.for_job_id, p.kind) for p in decisions.preemptions] == [
        ("g", "p", "reclaim")
    ]
    after = notices_ended(before, before.running[0], before.pending[0])
    assert [p.job_id for p in schedule(after, CONFIG).placements] == ["p"]


def test_a_gang_whose_submit_time_is_unknown_is_judged_as_before() -> None:
    """Without its submit time (a snapshot built without it) the order is not tested."""
    heavy = 500.0 * 8 * 24 * HOUR
    before = cohort(heavy, 0.0, replace(gang(NOW - 5 * HOUR), submitted_at=None))
    assert [p.job_id for p in schedule(before, CONFIG).preemptions] == ["g"]


# --- priority: a smaller declared size -----------------------------------------------------


def test_a_smaller_job_of_a_lower_class_that_would_stand_first_is_not_preempted() -> None:
    """Ageing aside, size: a low job declaring 1 GPU-hour, submitted with a high one
    declaring 8 GPUs for 100 h (800 GPU-hours: 8 x log10(800) = 23 levels of size against
    three of priority). Re-queued, it would go first; so the high job waits."""
    queues = (queue("q", 8),)
    small = replace(
        running("r", "q", {"n1": 1}, priority="low", started=NOW - HOUR, runtime=HOUR),
        submitted_at=NOW - HOUR,
        seq=0,
    )
    big = pending("p", "q", 8, priority="high", at=NOW - HOUR, runtime=100 * HOUR, seq=1)
    before = snap((node("n1", 8),), queues, (big,), (small,))
    after = notices_ended(before, small, big)
    assert [p.job_id for p in schedule(after, CONFIG).placements] == ["r"]
    assert schedule(before, CONFIG).preemptions == ()
    # The same high job declaring 10 min (1.3 GPU-hours: one level) stands first: it preempts.
    short = replace(big, declared_runtime_s=600.0)
    decisions = schedule(replace(before, pending=(short,)), CONFIG)
    assert [p.job_id for p in decisions.preemptions] == ["r"]
